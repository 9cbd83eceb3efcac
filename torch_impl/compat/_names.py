"""Error names of the compat entry points: an error raised by the native op they forward to
names the *native* argument (``sm_scale``, ``out``, ``sources[1].kv_cache`` ...); SPEC "bad
input" requires the name in the signature the caller used. Each compat entry point validates
what it can itself, and wraps the forwarded call in :func:`own_names` so that anything the
native op still refuses is re-raised under the compat function's own argument name."""
from __future__ import annotations

import contextlib
from typing import Mapping


@contextlib.contextmanager
def own_names(mapping: Mapping[str, str]):
    """Re-raise a TypeError / ValueError whose message starts ``"<native>:"`` (a key of
    ``mapping``, longest first) as the same type starting ``"<mapping[native]>:"``. Other
    exceptions, and messages naming no mapped argument, pass unchanged."""
    try:
        yield
    except (TypeError, ValueError) as e:
        if type(e) in (TypeError, ValueError):
            msg = str(e)
            for native in sorted(mapping, key=len, reverse=True):
                if msg.startswith(native + ":"):
                    raise type(e)(mapping[native] + msg[len(native):]) from e
        raise

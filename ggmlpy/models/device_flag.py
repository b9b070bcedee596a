"""The ``--device`` flag of the model commands (``ggmlpy embed``, ``ggmlpy generate``): one
name or several joined by commas, checked and normalised once for both."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from ggmlpy.cli_names import register_named_devices

__all__ = ["pick_devices"]

_RAY_RE = re.compile(r"^RAY(\d+)$", re.IGNORECASE)


def pick_devices(spec: str, prog: str, usage_error: Callable[[str], Exception]) -> str:
    """Check and normalise a command line's ``--device`` (one name or several joined by commas);
    returns the names joined by commas, blanks stripped.

    SIM devices are registered on demand when GGMLPY_SIM_DEVICES is unset, and RAY devices (a
    local Ray instance) when neither GGMLPY_RAY_DEVICES nor GGMLPY_RAY_ADDRESS is set: once, for
    the highest index named, with one line ``"{prog}: started ..."`` on stderr. Every name must
    then be a device (:func:`ggmlpy.backend.registry.device_unavailable_reason`: a name
    GGMLPY_BACKENDS leaves out says so), listed once, and the CPU only alone.

    Raises:
        ``usage_error(message)``: one line naming ``--device`` and the offending name.
    """
    from ggmlpy.backend import registry
    from ggmlpy.core import env

    names = [n.strip() for n in spec.split(",")]
    if not all(names):
        raise usage_error(f"--device {spec!r}: an empty device name (several names are joined "
                          "by commas: SIM0,SIM1)")
    register_named_devices(names, prog)
    ray_idx = [int(m.group(1)) for m in map(_RAY_RE.match, names)
               if m and registry.dev_by_name(m.group(0)) is None
               and not registry.backends_env_leaves_out(m.group(0))]
    if ray_idx and not env.ray_requested() and env.ray_devices() != 0:
        from ggmlpy.backends.ray.runtime import register_ray_devices

        n = max(ray_idx) + 1
        register_ray_devices(n)
        print(f"{prog}: started {n} RAY device(s) on a local Ray instance "
              "(set GGMLPY_RAY_DEVICES=N or GGMLPY_RAY_ADDRESS to choose)", file=sys.stderr)
    for name in names:
        why = registry.device_unavailable_reason(name)
        if why:
            raise usage_error(f"--device {name}: {why}")
    canon = [registry.dev_by_name(n).name for n in names]
    if len(canon) > 1 and "CPU" in (c.upper() for c in canon):
        raise usage_error(f"--device {spec}: the CPU cannot be one of several offload devices "
                          "(pass --device CPU alone, or accelerators only)")
    twice = sorted({c for c in canon if canon.count(c) > 1})
    if twice:
        raise usage_error(f"--device {spec}: {', '.join(twice)} listed twice")
    return ",".join(names)

"""The settings of RAY devices: the arguments a caller gives, else the ``GGMLPY_RAY_*`` variables
(parsed and validated in :mod:`ggmlpy.core.env`), else the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from ggmlpy.core import env
from ggmlpy.core.check import check_int, check_number

__all__ = ["RayEnv", "ray_env", "DEFAULT_TIMEOUT_S", "DEFAULT_CPUS", "DEFAULT_OBJECT_STORE_MB"]

DEFAULT_TIMEOUT_S = 120.0
DEFAULT_CPUS = 2
DEFAULT_OBJECT_STORE_MB = 512


@dataclass(frozen=True)
class RayEnv:
    """Validated RAY settings.

    Attributes:
        n: devices to start, or None (a cluster: one per GPU, else one per node).
        address: cluster to join (``"auto"`` or ``"HOST:PORT"``), or None for a local instance.
        timeout_s: bound of every wait on an actor, seconds.
        num_cpus: CPUs of a local instance.
        object_store_mb: object store of a local instance, MiB.
    """

    n: int | None
    address: str | None
    timeout_s: float
    num_cpus: int
    object_store_mb: int


def ray_env(n: int | None = None, address: str | None = None,
            timeout_s: float | None = None) -> RayEnv:
    """The RAY settings: the arguments where given, else the environment, else the defaults
    (a local instance gets 1 device when neither ``n`` nor ``GGMLPY_RAY_DEVICES`` says).

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: ``n < 1``, ``timeout_s <= 0``, a malformed ``address``, or a malformed
            ``GGMLPY_*`` variable (:class:`~ggmlpy.core.env.EnvError`).
    """
    where = "RAY devices"
    if n is None:
        n = env.ray_devices() or None
    else:
        check_int("n", n, 1, 1024, where)
    if address is None:
        address = env.ray_address()
    else:
        address = env.parse_ray_address(address, "address")
    if timeout_s is None:
        timeout_s = env.ray_timeout_s() or DEFAULT_TIMEOUT_S
    else:
        check_number("timeout_s", timeout_s, 0.0, where=where, lo_open=True)
    if n is None and address is None:
        n = 1
    return RayEnv(n, address, float(timeout_s), env.ray_cpus() or DEFAULT_CPUS,
                  env.ray_object_store_mb() or DEFAULT_OBJECT_STORE_MB)

"""The CPU backend: C++ (OpenMP allowed) through g++ with torch's headers; runs everywhere."""

from __future__ import annotations

import platform

from verifier.backends import Backend, register


@register
class CpuBackend(Backend):
    """Host C++ kernels on the CPU; the Backend defaults are already the CPU behaviour."""

    name = "cpu"
    device_type = "cpu"

    def device_name(self) -> str:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                for line in fh:
                    if line.startswith("model name"):
                        return "cpu:" + line.split(":", 1)[1].strip()
        except OSError:
            pass
        return "cpu:" + (platform.processor() or platform.machine())

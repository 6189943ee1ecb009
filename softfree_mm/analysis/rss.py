"""A process's resident memory on Linux, read from /proc (elsewhere: nothing, and the callers say so)."""
from typing import Optional


def status_kib(pid='self', field: str = 'VmRSS') -> Optional[int]:
    """A ``/proc/<pid>/status`` field in KiB (VmRSS: resident now; VmHWM: the peak since the last reset), None where
    it cannot be read."""
    try:
        with open(f'/proc/{pid}/status') as f:
            for line in f:
                if line.startswith(field + ':'):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset this process's peak resident set size (VmHWM), True when it could be done."""
    try:
        with open('/proc/self/clear_refs', 'w') as f:
            f.write('5')
        return True
    except OSError:
        return False

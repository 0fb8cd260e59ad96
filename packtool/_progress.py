"""The one progress bar every command shows; no heavy import (the CLI loads it at start)."""


def progress_bar(total: int, desc: str, unit: str = "tok", enabled: bool = True):
    """The one progress bar every command shows (tqdm on stderr), or None when disabled.
    ``unit="B"`` counts bytes in KiB/MiB."""
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=True, desc=desc, dynamic_ncols=True,
                mininterval=0.5, **({"unit_divisor": 1024} if unit == "B" else {}))

"""``packtool`` and ``python -m packtool``: signal handlers first, then everything else.

Ctrl-C or SIGTERM during the imports (click, numpy: ~0.1-0.3 s) must end the run like any
other moment does, with 130/143 and a line, not a KeyboardInterrupt traceback and exit 1.
"""

import signal
import sys


def main() -> None:
    from . import _signals

    _signals.install()
    try:
        from .cli import main as cli_main
    except KeyboardInterrupt:
        term = bool(_signals.received) and _signals.received[-1] == signal.SIGTERM
        print(f"{'Terminated' if term else 'Interrupted'}: no output was written.",
              file=sys.stderr)
        sys.exit(143 if term else 130)
    cli_main()


if __name__ == "__main__":
    main()

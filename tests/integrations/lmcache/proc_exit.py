"""How the LMCache subprocess scripts (engine_proc.py, l2_proc.py, run by path in LMCache's
venv) end: a traceback and exit 1 on any error, else exit 0 at once -- LMCache's non-daemon
threads would keep the process alive."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable


def run(main: Callable[[], None]) -> None:
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    os._exit(0)

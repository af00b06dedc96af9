"""SageMaker script-mode entry point: ``python launcher/entry.py --key value ...``.

With this repository as ``source_dir`` SageMaker runs this file directly, often without the
package installed, so the repository root goes on ``sys.path`` first (and this folder comes
off it, so no module here can shadow a standard-library one).
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def _main() -> int:
    import faulthandler
    import signal

    # `kill -USR1 <pid>` prints every thread's stack (a hung node, a stuck loader worker) to the log
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    from launcher.node import main

    return main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(_main())

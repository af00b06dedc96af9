"""A module that starts a thread when it is imported (and the thread runs on)."""
import threading
import time

threading.Thread(target=time.sleep, args=(3600,), name="left-running", daemon=True).start()

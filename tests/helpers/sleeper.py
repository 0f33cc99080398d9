"""A stand-in for ``intellect-node``: takes any arguments, prints its pid, sleeps a minute
(a child process whose life the tests follow)."""

import os
import time

if __name__ == "__main__":
    print(os.getpid(), flush=True)
    time.sleep(60)

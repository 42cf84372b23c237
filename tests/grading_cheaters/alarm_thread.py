"""Ignore SIGALRM, leave a non-daemon thread running forever, and hang in one rmsnorm case."""

import signal
import threading
import time

import torch

from ._honest import rmsnorm as _rmsnorm

signal.signal(signal.SIGALRM, signal.SIG_IGN)
threading.Thread(target=lambda: time.sleep(10**6), name="lingering").start()


def rmsnorm(x, weight, eps=1e-5):
    if x.dtype == torch.float64 and float(x.abs().max()) < 0.1:
        while True:
            time.sleep(0.5)
    return _rmsnorm(x, weight, eps)

"""The switch's lock as a C mutex, so that the switch process's packet loop in C
(testbed/switch/native/hop.py's `xm_emu_loop`) can take it while a frame runs and leave it
while it waits, with no Python in between; Python code takes it as it takes an RLock
(`with sw.lock:`), from any thread.

A recursive pthread mutex: the thread that holds it may take it again (a callback from the
C loop into V1Switch code that takes the lock, as the RLock allowed). cffi releases the GIL
around each call, so a thread waiting for the mutex does not hold up the one that has it.
"""

from __future__ import annotations

import hashlib
from types import TracebackType
from typing import Any

from testbed.switch.native.build import build, load

_CDEF = """
void *xm_mutex_new(void);
void xm_mutex_free(void *m);
int xm_mutex_lock(void *m);
int xm_mutex_trylock(void *m);
int xm_mutex_timedlock(void *m, int64_t timeout_ns);
int xm_mutex_unlock(void *m);
"""

_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* a recursive mutex, or NULL out of memory */
void *xm_mutex_new(void)
{
    pthread_mutex_t *m = malloc(sizeof *m);
    pthread_mutexattr_t a;
    if (!m) return NULL;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
    int rc = pthread_mutex_init(m, &a);
    pthread_mutexattr_destroy(&a);
    if (rc) {
        free(m);
        return NULL;
    }
    return m;
}

void xm_mutex_free(void *m)
{
    pthread_mutex_destroy(m);
    free(m);
}

int xm_mutex_lock(void *m)
{
    return pthread_mutex_lock(m);
}

/* 0 when taken, EBUSY when another thread holds it */
int xm_mutex_trylock(void *m)
{
    return pthread_mutex_trylock(m);
}

/* 0 when taken within timeout_ns, ETIMEDOUT when not */
int xm_mutex_timedlock(void *m, int64_t timeout_ns)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    int64_t ns = t.tv_nsec + timeout_ns;
    t.tv_sec += ns / 1000000000;
    t.tv_nsec = ns % 1000000000;
    return pthread_mutex_timedlock(m, &t);
}

/* 0, or EPERM when this thread does not hold it */
int xm_mutex_unlock(void *m)
{
    return pthread_mutex_unlock(m);
}
"""

_LOADED: tuple[Any, Any] | None = None


def _loaded() -> tuple[Any, Any]:
    global _LOADED
    if _LOADED is None:
        _LOADED = load(_CDEF, build(_C, hashlib.sha256(_C.encode()).hexdigest(), "mutex"))
    return _LOADED


class NativeLock:
    """A recursive lock held in C (`address`: its pthread_mutex_t), used as threading.RLock.
    BuildError where no C compiler is found: the caller keeps its RLock."""

    def __init__(self) -> None:
        self._ffi, self._lib = _loaded()
        m = self._lib.xm_mutex_new()
        if m == self._ffi.NULL:
            raise MemoryError("cannot make a mutex")
        self._m = m
        self.address = int(self._ffi.cast("uintptr_t", m))

    def __del__(self) -> None:
        lib = getattr(self, "_lib", None)
        if lib is not None:
            lib.xm_mutex_free(self._m)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        """As RLock.acquire: wait for it (or up to `timeout` seconds), or not at all."""
        if not blocking:
            return self._lib.xm_mutex_trylock(self._m) == 0
        if timeout >= 0:
            return self._lib.xm_mutex_timedlock(self._m, int(timeout * 1e9)) == 0
        rc = self._lib.xm_mutex_lock(self._m)
        if rc:
            raise RuntimeError(f"the switch's lock failed (error {rc})")
        return True

    def release(self) -> None:
        if self._lib.xm_mutex_unlock(self._m):
            raise RuntimeError("cannot release un-acquired lock")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

"""A fork server per allocator setting, so that a run comparing allocators forks its workers instead of starting
each as a new interpreter that pays the imports again.

An allocator is chosen before a process starts, so each setting's server starts under its environment. CPython keeps
one fork server per process; this module keeps its own and hands each worker to one (_Popen._launch, otherwise
CPython 3.11's code).
"""
from __future__ import annotations

import contextlib
import io
import os
from multiprocessing import forkserver, popen_forkserver, process, reduction, spawn, util
from multiprocessing.context import set_spawning_popen

_SERVERS: dict[str, forkserver.ForkServer] = {}


@contextlib.contextmanager
def _environment(env: dict[str, str]):
    """os.environ is `env` inside the block (a fork server's interpreter inherits it when it starts)."""
    saved = dict(os.environ)
    for k in set(saved) - set(env):
        del os.environ[k]
    os.environ.update(env)
    try:
        yield
    finally:
        for k in set(os.environ) - set(saved):
            del os.environ[k]
        os.environ.update(saved)


def server(setting: str, env: dict[str, str], preload: list[str]) -> forkserver.ForkServer:
    """The running fork server of `setting`, started under `env` the first time (or again if it died)."""
    fs = _SERVERS.get(setting)
    if fs is None:
        fs = _SERVERS[setting] = forkserver.ForkServer()
        fs.set_forkserver_preload(preload)
    with _environment(env):
        fs.ensure_running()
    return fs


def pid(setting: str) -> int | None:
    fs = _SERVERS.get(setting)
    return None if fs is None else fs._forkserver_pid


def stop_all() -> None:
    """Stop every server this process started (their workers have ended: a rounds run waits for each)."""
    while _SERVERS:
        _, fs = _SERVERS.popitem()
        with contextlib.suppress(OSError, ChildProcessError):
            fs._stop()


class _Popen(popen_forkserver.Popen):
    """popen_forkserver.Popen asking `server` for the child instead of the process-wide fork server."""

    def __init__(self, process_obj, server: forkserver.ForkServer):
        self._server = server
        super().__init__(process_obj)

    def _launch(self, process_obj):
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = self._server.connect_to_new_process(self._fds)
        # the parent keeps a duplicate of the data pipe's write end as the child's sentinel of its parent
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class Worker(process.BaseProcess):
    """A multiprocessing Process forked from the fork server of allocator `setting` (started with `server`)."""

    _start_method = "forkserver"

    def __init__(self, setting: str, **kwargs):
        super().__init__(**kwargs)
        self._setting = setting

    def _Popen(self, process_obj):
        if self._setting not in _SERVERS:
            raise RuntimeError(f"no fork server for allocator setting {self._setting!r}: start it with server()")
        return _Popen(process_obj, _SERVERS[self._setting])

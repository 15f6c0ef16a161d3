"""A fork server per allocator setting, so that a run comparing allocators forks its workers instead of starting
each as a new interpreter.

An allocator is chosen before a process starts (LD_PRELOAD, glibc's MALLOC_* variables:
sdperf.optimizations.allocator), so a rounds run that compares one used to start every worker, the fp32 baseline's
too, as a new interpreter, and each paid the imports again: 7.4 s of torch, diffusers and transformers per worker
on cpu, for every worker of the cpu profile's 10_ladder (its allocator rung, its ladder and its stack search); the
rung is part of the rounds up front, whose workers then all start from these servers.
Here each setting gets a fork server of its own, started as a new interpreter under that setting's environment
and importing what every worker needs (sdperf.measure.rounds.PRELOAD), as the study's default fork server does.
A worker forked from it runs under its allocator from its first instruction (the library is mapped, glibc read
the variables at start-up), and it is still a new process per configuration, started the same way as every other
worker of the run: the baseline's from the default setting's server, a tcmalloc worker from tcmalloc's.

CPython keeps one fork server per process (multiprocessing.forkserver._forkserver); this module keeps its own
ForkServer objects and hands each worker to one through popen_forkserver's launch with that server in place of
the module's one (_Popen._launch, otherwise CPython 3.11's code). The servers die with their launcher
(sdperf.measure.forkserver_lifeline, imported first) and are stopped when a rounds run ends (stop_all): one
holds its imported libraries (~0.4 GB) for as long as it lives.
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
    """The process id of `setting`'s fork server, None when it has none."""
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

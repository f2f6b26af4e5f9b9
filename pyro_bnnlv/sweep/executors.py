"""Where a sweep's tasks run: in this process, in local worker processes, or on a Ray cluster.

Every executor calls :func:`execute` on each task and yields its outcome (a dict) as soon as the
task finishes, in completion order; the driver writes each outcome to the store. Executors keep at
most ``slots`` tasks in flight and ask ``accept()`` before starting each one: once it answers
``False`` (a sweep's ``stop_after`` has passed) no task starts, the running ones finish, and the
rest stay pending in the store. The local executor is the standard library's
:class:`concurrent.futures.ProcessPoolExecutor` with the ``spawn`` start method (tasks see only
their key), the Ray executor ``ray.remote`` tasks collected with ``ray.wait``.

:func:`execute` pins torch to ``threads`` threads (default 1; fixed, since torch's results depend
on the thread count), clears Pyro's parameter store and seeds Python, NumPy, torch and Pyro with
``task.seed`` before calling the task function, so a task's numbers depend on its key only. Local
and Ray workers keep freed memory in the heap (:func:`~pyro_bnnlv._platform.retain_freed_memory`;
``pyro-bnnlv bench allocator``).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime, timezone
from typing import Any

from .._platform import retain_freed_memory, skip_collection_at_exit, usable_cores
from .store import TABLE_FIELDS
from .task import KEY_FIELDS, Task

__all__ = [
    "EXECUTORS",
    "InlineExecutor",
    "LocalExecutor",
    "RayExecutor",
    "available_cores",
    "check_executor_args",
    "check_ray_address",
    "cores_note",
    "execute",
    "make_executor",
]

EXECUTORS = ("local", "ray", "inline")
_RESERVED = {"task_id", "status", *KEY_FIELDS, *TABLE_FIELDS}


#: the cores this process may run on (one definition: :func:`pyro_bnnlv._platform.usable_cores`)
available_cores = usable_cores


#: ``accept()`` is asked before each task starts; ``False``: start no more tasks
Accept = Callable[[], bool]


def _always() -> bool:
    return True


def _plain(value: Any, name: str) -> Any:
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    item = getattr(value, "item", None)  # numpy scalars, one-element tensors and arrays
    if callable(item):
        try:
            return _plain(item(), name)
        except (ValueError, RuntimeError):  # more than one element
            pass
    raise TypeError(
        f"the task function returned {name}={value!r} of type {type(value).__name__}; results must "
        "be str, int, float, bool or None (store arrays as files and return their paths)"
    )


def _encode_result(result: Any, task: Task) -> str:
    import json

    if not isinstance(result, Mapping):
        raise TypeError(f"the task function must return a dict of results, got {type(result).__name__}")
    clash = sorted(set(map(str, result)) & (_RESERVED | set(task.params)))
    if clash:
        raise ValueError(f"the task function's result reuses the table's column names {clash}; rename them")
    return json.dumps({str(k): _plain(v, str(k)) for k, v in result.items()})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def execute(fn: Callable[[Task], Mapping[str, Any]], task: Task, threads: int = 1) -> dict[str, Any]:
    """Run one task (in a worker): seed, call ``fn(task)``, time it, catch its exception.

    Returns the outcome: ``id``, ``status`` (``"done"`` or ``"failed"``), ``result`` (JSON) or
    ``traceback``, ``seconds``, ``worker`` (``host:pid``), ``threads``, ``finished`` (UTC).
    """
    import pyro
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    out: dict[str, Any] = {"id": task.id, "worker": f"{socket.gethostname()}:{os.getpid()}", "threads": threads}
    t0 = time.perf_counter()
    try:
        pyro.clear_param_store()
        pyro.set_rng_seed(task.seed)
        out.update(status="done", result=_encode_result(fn(task), task))
    except (Exception, SystemExit):  # sys.exit() in a task fails that task, not the sweep
        out.update(status="failed", traceback=traceback.format_exc())
    finally:
        torch.set_num_threads(previous)
    out.update(seconds=time.perf_counter() - t0, finished=_now())
    return out


def _execute_retaining_memory(fn: Callable[[Task], Mapping[str, Any]], task: Task, threads: int = 1) -> dict[str, Any]:
    """:func:`execute` in a Ray worker, which keeps freed memory in the heap first (a ``mallopt``
    call: cheap, and the same setting on every call)."""
    retain_freed_memory()
    return execute(fn, task, threads)


def _failed(task: Task, err: BaseException, where: str, hint: str = "") -> dict[str, Any]:
    """The outcome of a task whose worker failed (not the task function: that is caught inside)."""
    tb = "".join(traceback.format_exception(type(err), err, err.__traceback__)).rstrip()
    return {"id": task.id, "status": "failed", "traceback": f"{where}\n{tb}{hint}", "finished": _now()}


#: the outcome's last line (the one summaries show) when the worker processes die while starting
_SPAWN_HINT = (
    "\nHint: the worker processes died while starting, before running any task: the script that started the "
    "sweep probably runs it at import time. Worker processes are started with 'spawn' and import the main "
    "script again, so put the sweep under `if __name__ == \"__main__\":` or use executor='inline'."
)
#: the outcome's last line when a task's worker died while it was the only task in flight
_CULPRIT = (
    "\nThis task ended its worker process: it was the only task running when the process died "
    "(os._exit in the task, a crash in compiled code, or the system killed it for memory); the other "
    "tasks are unaffected (those running beside it were run again)."
)


class InlineExecutor:
    """Runs the tasks one after another in this process (for debugging: breakpoints work)."""

    name = "inline"

    def __init__(self, threads: int = 1) -> None:
        self.threads, self.slots = threads, 1

    def run(self, fn: Callable, tasks: Sequence[Task], accept: Accept = _always) -> Iterator[dict[str, Any]]:
        for task in tasks:
            if not accept():
                return
            yield execute(fn, task, self.threads)

    def close(self) -> None:
        pass


def _init_worker(driver_pid: int, started: Any) -> None:
    """Pool-worker initializer: count this worker as started (past importing the main script: a
    pool that breaks with ``started`` still 0 died in start-up, not in a task), keep freed memory in
    the heap (:func:`~pyro_bnnlv._platform.retain_freed_memory`: the same numbers, faster steps),
    exit without collecting torch's objects (:func:`~pyro_bnnlv._platform.skip_collection_at_exit`)
    and end this worker when the driver is gone
    (:func:`_exit_with_driver`)."""
    with started.get_lock():
        started.value += 1
    retain_freed_memory()
    skip_collection_at_exit()
    _exit_with_driver(driver_pid)


def _exit_with_driver(driver_pid: int, every: float = 0.5) -> None:
    """End this worker when the driver process is gone.

    A driver killed with SIGKILL (or by a time-out) runs no clean-up, and its
    ``ProcessPoolExecutor`` workers would wait on the task queue forever: each holds the queue's
    write end, so none ever reads end-of-file. A daemon thread notices the new parent and exits
    the worker.
    """
    import threading

    def watch() -> None:
        while os.getppid() == driver_pid:
            time.sleep(every)
        os._exit(0)

    threading.Thread(target=watch, name="pyro_bnnlv-driver-watch", daemon=True).start()


class LocalExecutor:
    """``workers`` processes of a ``spawn`` :class:`~concurrent.futures.ProcessPoolExecutor`, at
    most ``workers`` tasks submitted at a time (so a task not yet submitted can still be held back
    by ``accept``).

    A worker process that dies (a task calling ``os._exit``, a crash in compiled code, the
    out-of-memory killer) breaks the whole pool and every task in flight with it. The pool is
    replaced and the tasks that were in flight run again one at a time: a task whose worker dies
    while it is the only one in flight is the culprit and fails with a message saying so; the
    others complete. If no worker of the pool got past start-up (the main script runs the sweep
    at import time), every remaining task fails with that hint instead.
    """

    name = "local"

    def __init__(self, workers: int, threads: int = 1) -> None:
        self.threads, self.slots = threads, workers

    def run(self, fn: Callable, tasks: Sequence[Task], accept: Accept = _always) -> Iterator[dict[str, Any]]:
        queue, suspects = list(tasks)[::-1], []  # both popped from the end
        context = multiprocessing.get_context("spawn")
        while queue or suspects:
            started = context.Value("i", 0)
            pool = ProcessPoolExecutor(
                max_workers=self.slots, mp_context=context, initializer=_init_worker, initargs=(os.getpid(), started)
            )
            inflight: dict[Any, Task] = {}
            try:
                while True:
                    broken = False  # a worker died after the last results: submit refuses new tasks
                    if suspects:  # one at a time, nothing else in flight
                        if not inflight:
                            task = suspects.pop()
                            if not _submit(pool, inflight, fn, task, self.threads):
                                suspects.append(task)
                                broken = True
                    else:
                        while queue and len(inflight) < self.slots and accept():
                            task = queue.pop()
                            if not _submit(pool, inflight, fn, task, self.threads):
                                queue.append(task)  # it never started: it goes to the fresh pool
                                broken = True
                                break
                    if not inflight:
                        if broken:
                            break  # a fresh pool for the rest
                        return
                    done, _ = wait(inflight, return_when=FIRST_COMPLETED)
                    lost, error = [], None
                    for future in done:
                        task = inflight.pop(future)
                        try:
                            yield future.result()
                        except BrokenProcessPool as err:  # a worker died: the pool and all in flight are lost
                            lost.append(task)
                            error = err
                        except Exception as err:  # the task or its result could not be shipped
                            yield _failed(task, err, "the worker process could not run this task")
                    if error is None:
                        continue
                    lost += inflight.values()
                    if not started.value:  # no worker got past start-up: no task can run
                        for task in [*lost, *suspects[::-1], *queue[::-1]]:
                            yield _failed(task, error, "the worker processes failed to start", _SPAWN_HINT)
                        return
                    if len(lost) == 1:
                        yield _failed(lost[0], error, "the worker process running this task died", _CULPRIT)
                    else:
                        suspects += lost[::-1]
                    break  # a fresh pool for the rest
            finally:  # on an error or Ctrl-C: nothing more is submitted
                pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        pass


def _submit(pool: ProcessPoolExecutor, inflight: dict[Any, Task], fn: Callable, task: Task, threads: int) -> bool:
    """Submit ``task``; ``False`` if the pool is already broken (a worker died since the last
    results came in: the tasks in flight then fail with ``BrokenProcessPool`` and are handled there)."""
    try:
        inflight[pool.submit(execute, fn, task, threads)] = task
    except BrokenProcessPool:
        return False
    return True


def _import_ray():
    try:
        import ray
    except ImportError:
        raise ImportError(
            "executor='ray' needs Ray: pip install 'pyro_bnnlv[ray]' (or pip install 'ray>=2.9')"
        ) from None
    return ray


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """``ConnectionError`` naming the fix unless ``host:port`` (or ``ray://host:port``) accepts TCP.

    Ray itself retries an unreachable address for minutes; this check answers in ``timeout``
    seconds. ``"auto"`` (the cluster started on this machine by ``ray start``) is left to Ray.
    """
    if address == "auto":
        return
    hostport = address.split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"address={address!r} must look like host:port or ray://host:port (or 'auto')")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as err:
        raise ConnectionError(
            f"cannot reach a Ray cluster at address={address!r} ({err}); start one with `ray start "
            "--head` and pass the address it prints, or leave the address out for a local Ray instance"
        ) from None


class RayExecutor:
    """``ray.remote`` tasks, at most ``slots`` in flight, collected with ``ray.wait``.

    Uses the Ray instance this process is already connected to if any; else connects to
    ``address`` (checked first, see :func:`check_ray_address`) or starts a local instance with
    ``num_cpus=workers`` whose workers see this process's ``sys.path`` (so task functions from
    scripts and test modules import). On a remote cluster the task function's module must be
    importable on every node (install ``pyro_bnnlv`` there, or pass a ``runtime_env`` to your own
    ``ray.init`` before calling :func:`~pyro_bnnlv.sweep.run_sweep`).
    """

    name = "ray"

    def __init__(self, workers: int | None, threads: int = 1, address: str | None = None) -> None:
        ray = self._ray = _import_ray()
        self.threads, self._owns = threads, False
        if ray.is_initialized() and address:
            raise ValueError(
                f"this process is already connected to Ray, so address={address!r} would be ignored; "
                "leave the address out to use that connection, or call ray.shutdown() first"
            )
        if not ray.is_initialized():
            if address:
                check_ray_address(address)
                ray.init(address=address, log_to_driver=False)
            else:
                path = os.pathsep.join(p for p in sys.path if p)
                ray.init(
                    num_cpus=workers or available_cores(),
                    include_dashboard=False,
                    log_to_driver=False,
                    runtime_env={"env_vars": {"PYTHONPATH": path}},
                )
            self._owns = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.slots = workers or max(1, cpus // threads)

    def run(self, fn: Callable, tasks: Sequence[Task], accept: Accept = _always) -> Iterator[dict[str, Any]]:
        ray = self._ray
        remote = ray.remote(num_cpus=self.threads)(_execute_retaining_memory)
        fn_ref = ray.put(fn)
        queue, inflight = list(tasks)[::-1], {}
        try:
            while queue or inflight:
                while queue and len(inflight) < self.slots and accept():
                    task = queue.pop()
                    inflight[remote.remote(fn_ref, task, self.threads)] = task
                if not inflight:
                    return
                done, _ = ray.wait(list(inflight), num_returns=1)
                for ref in done:
                    task = inflight.pop(ref)
                    try:
                        yield ray.get(ref)
                    except Exception as err:  # the Ray worker died or the task could not be shipped
                        yield _failed(task, err, "the Ray task running this task failed")
        finally:
            for ref in inflight:
                ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._owns:
            self._ray.shutdown()


def check_executor_args(executor: str, workers: int | None, threads: int, address: str | None) -> None:
    """``ValueError`` naming the argument unless the executor options make sense."""
    if executor not in EXECUTORS:
        raise ValueError(f"executor must be one of {list(EXECUTORS)}, got {executor!r}")
    if address is not None and executor != "ray":
        raise ValueError(f"address={address!r} is for executor='ray' (got executor={executor!r})")
    for name, value in (("workers", workers), ("threads", threads)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be a positive int (or None), got {value!r}")


def make_executor(executor: str, *, workers: int | None, threads: int, address: str | None, num_tasks: int):
    """The executor named ``executor`` (one of :data:`EXECUTORS`); ``ValueError`` on bad options."""
    check_executor_args(executor, workers, threads, address)
    if executor == "inline":
        return InlineExecutor(threads)
    if executor == "ray":
        return RayExecutor(workers, threads, address)
    default = max(1, available_cores() // threads)
    return LocalExecutor(max(1, min(workers or default, num_tasks)), threads)


def cores_note(executor: Any) -> str:
    """``"local: 2 workers x 1 torch thread"``."""
    w, t = executor.slots, executor.threads
    return f"{executor.name}: {w} worker{'s' * (w != 1)} x {t} torch thread{'s' * (t != 1)}"

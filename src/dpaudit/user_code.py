"""The audited training function's calls: run in a worker process the auditor owns, or in
this process, with the same contract checks either way.

``dpaudit audit-impl`` must survive the code it audits. A :class:`Worker` is a Python
process started for one training function (``python -m dpaudit.user_code``, a session of
its own, so that its whole process group can be killed): the function is sent by reference
(a ``"module.path:function"`` target, or a picklable callable such as a module-level
function), the training data once, and every call a request that carries the seeds, the
spec, the mode's extra argument (``init``, or the description of a
:class:`dpaudit.dpsgd.GradientCanaries` built there) and the rows to predict on, so that
train and its predict run in one round trip and ``predict`` never crosses the process
boundary. Whatever the code does, the auditor gets back a reply or one
:class:`UserCodeFailed` naming the call and what happened: an exception of any class
(``KeyboardInterrupt``, ``SystemExit``, one whose ``__str__`` raises), the process ending
(``os._exit``, a signal), a fork whose child outlives the call, arrays it was given
changed in place, or a call past its time limit, which the auditor enforces from outside by
killing the process group. The worker trains with ``threads`` torch threads (default 1).

:func:`serve` is one request's work, shared by the worker and :func:`in_process` (the
library's path for functions that cannot be sent by reference, e.g. closures in tests, and
for dpaudit's own registry subjects, whose runs train beside each other as columns of one
call: :func:`dpaudit.subjects.train_columns`).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback

#: The contract of a training function's output, for messages.
CONTRACT = ("train(X, y, seeds, spec) must return predict, and predict(x) a floating-point "
            "torch tensor of logits of shape (len(seeds), len(x), n_classes)")


class UserCodeFailed(Exception):
    """A call of the audited training function (or of the ``predict`` it returned) failed:
    ``call`` names it, ``what`` says what happened (e.g. "raised ValueError: bad"), and
    ``trace`` holds the traceback's frames outside dpaudit where it raised. ``timed_out``:
    it ran past ``limit`` seconds. In this process an exception is the ``__cause__``."""

    def __init__(self, call: str, timed_out: bool = False, limit: float | None = None,
                 what: str = "", trace: str = ""):
        if timed_out:
            what = f"ran past its limit of {limit:g} s"
        super().__init__(f"{call} {what}".strip())
        self.call, self.timed_out, self.limit = call, timed_out, limit
        self.what, self.trace = what, trace


class Unauditable(ValueError):
    """The training function's runs cannot be audited (they break the contract, diverge,
    learn nothing or do not follow their seeds): any verdict on them would certify nothing."""


class _PastLimit(BaseException):
    """Raised into an in-process call at its time limit; not an Exception, so that the
    audited code's ``except Exception`` does not swallow it."""


def _safe(fn, fallback: str) -> str:
    try:
        return str(fn())
    except BaseException:  # noqa: BLE001  (the user's __str__ may raise anything)
        return fallback


def describe(exc: BaseException) -> tuple[str, str]:
    """What raising ``exc`` was (one line, e.g. "raised ValueError: bad train", "called
    sys.exit(0)"), and its traceback's frames outside dpaudit (the user's own, and the
    libraries they call); neither step can raise, whatever ``exc``'s ``__str__`` does."""
    name = _safe(lambda: type(exc).__name__, "an exception")
    if isinstance(exc, SystemExit):
        what = f"called sys.exit({_safe(lambda: repr(exc.code), '?')})"
    elif isinstance(exc, _ProcessExit):
        what = str(exc)
    else:
        message = _safe(lambda: (str(exc).splitlines() or [""])[0],
                        "<its message could not be made: str() raised>")
        what = f"raised {name}" + (f": {message}" if message else "")
    ours = os.path.dirname(os.path.abspath(__file__)) + os.sep
    try:
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not os.path.abspath(f.filename).startswith(ours)]
        trace = ("Traceback (most recent call last):\n" + "".join(
            traceback.format_list(frames))) if frames else ""
    except BaseException:  # noqa: BLE001
        trace = ""
    return what, trace


def user_call(call: str, limit: float | None, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in this process, the call of the audited code that ``call``
    names; :class:`UserCodeFailed` where it raises an Exception or runs past ``limit``
    seconds (None or 0: none). The limit is a SIGALRM timer, so it holds in the main thread
    of a POSIX process only, and it interrupts Python code, not a C call that never
    returns: code that is not dpaudit's own runs in a :class:`Worker`."""
    timed = bool(limit) and hasattr(signal, "SIGALRM") \
        and threading.current_thread() is threading.main_thread()
    if timed:
        def expire(signum, frame):
            raise _PastLimit
        previous = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return fn(*args, **kwargs)
    except _PastLimit:
        raise UserCodeFailed(call, True, limit) from None
    except Exception as exc:
        raise UserCodeFailed(call, what=describe(exc)[0]) from exc
    finally:
        if timed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)


class _ProcessExit(BaseException):
    """os._exit called by a module's top-level code while it is imported."""

    def __init__(self, status):
        super().__init__(status)
        self.status = status

    def __str__(self) -> str:
        return f"called os._exit({self.status})"


@contextlib.contextmanager
def _no_process_exit():
    """os._exit (and posix._exit) raise :class:`_ProcessExit` inside the block: the auditor
    imports the user's module itself (to read its signature), and a module ending the
    process there would end the audit with exit status 0 and no verdict."""
    import posix

    real = os._exit

    def refuse(status=0):
        raise _ProcessExit(status)

    os._exit = posix._exit = refuse
    try:
        yield
    finally:
        os._exit = posix._exit = real


def import_target(target: str):
    """The callable ``"module.path:function"`` names (``function`` may be dotted: an
    attribute of an attribute); ValueError naming ``target`` where it cannot be imported
    or is no callable."""
    import importlib

    module_name, sep, func_name = target.partition(":")
    if not sep or not module_name or not func_name:
        raise ValueError(f"--train {target!r}: must be 'module.path:function'")
    try:
        with _no_process_exit():
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--train {target!r}: cannot import module {module_name!r}: "
                         f"{exc}") from exc
    except BaseException as exc:  # noqa: BLE001  (its top-level code: sys.exit, say)
        raise ValueError(f"--train {target!r}: importing module {module_name!r} "
                         f"{describe(exc)[0]}") from None
    fn = module
    for part in func_name.split("."):
        fn = getattr(fn, part, None)
    if not callable(fn):
        raise ValueError(f"--train {target!r}: module {module_name!r} has no callable "
                         f"{func_name!r}")
    return fn


# ---- one request's work ---------------------------------------------------------------------

def _changed(given: dict, kept: dict) -> str | None:
    """The name of the first array the user's code changed in place (``given`` its copies of
    ``kept``), else None."""
    import torch

    for name, original in kept.items():
        copy = given[name]
        if copy.shape != original.shape or copy.dtype != original.dtype \
                or not torch.equal(copy, original):
            return name
    return None


def _logits_reply(z, runs: int, rows: int, n_classes: int):
    """``z`` on the CPU if it keeps the contract, else the Unauditable message."""
    import torch

    shape = tuple(getattr(z, "shape", ()))
    if isinstance(z, torch.Tensor) and z.is_floating_point() and shape == (runs, rows, n_classes):
        return z.detach().cpu()
    got = type(z).__module__ + "." + type(z).__name__
    if hasattr(z, "shape"):
        got += f" of shape {shape}, dtype {getattr(z, 'dtype', '?')}"
    raise Unauditable(f"predict(x) returned {got}; the contract is a floating-point torch "
                      f"tensor of shape (len(seeds)={runs}, len(x)={rows}, "
                      f"n_classes={n_classes})")


def _canary_reply(run, count: int) -> dict:
    """The white-box output ``run`` (a CanaryRun) as tensors on the CPU, refused
    (:class:`Unauditable`) unless ``scores`` (and ``llr`` where not None) are (count, 1)
    floating tensors."""
    import torch

    out = {}
    for name in ("scores", "llr"):
        v = getattr(run, name, None)
        if v is None and name == "llr":
            out[name] = None
            continue
        if not (isinstance(v, torch.Tensor) and v.is_floating_point()
                and tuple(v.shape) == (count, 1)):
            got = type(v).__name__ + (f" of shape {tuple(v.shape)}" if hasattr(v, "shape")
                                      else "")
            raise Unauditable(f"white-box mode: train(..., canaries=...) returned {name} "
                              f"{got}; the contract is a dpaudit.dpsgd.CanaryRun whose "
                              f"{name} is a floating tensor (len(seeds)={count}, 1)")
        out[name] = v.detach().double().cpu()
    return out


def serve(fn, X, y, request: dict, guard) -> dict:
    """One request's work: ``fn(X, y, seeds, spec, **extra)`` on copies of (X, y) (with the
    canary row ``request["insert"] = (x, label)`` appended), then, in the default modes,
    its predict on each of ``request["rows"]`` (the logits returned), or with
    ``request["canaries"]`` (directions, included, mates) a GradientCanaries built here and
    passed as ``canaries=`` (its CanaryRun's scores, llr and recorded insertions returned),
    or with ``request["method"]`` the value ``{"value": ...}`` of ``fn``'s method of that
    name, called as ``fn`` is (an adapter's set-up, e.g. :meth:`dpaudit.adapters.
    opacus_loop.OpacusLoop.claim`). ``guard(call, fn, *args, **kwargs)`` makes each call of
    the user's code, named by ``request["names"]`` (train's, predict's). Output that
    breaks the contract, and arrays changed in place, raise :class:`Unauditable`."""
    import torch

    train_name, predict_name = request["names"]
    if request.get("insert") is not None:
        x, label = request["insert"]
        X = torch.cat([X, x[None].to(X.dtype)])
        y = torch.cat([y, torch.tensor([label], dtype=y.dtype)])
    seeds, extra = list(request["seeds"]), dict(request.get("extra") or {})
    kept = {"X": X, "y": y}
    given = {"X": X.clone(), "y": y.clone()}
    method = request.get("method")
    if method is not None:  # an adapter's own method (e.g. OpacusLoop.claim): its value
        out = guard(train_name, getattr(fn, method), given["X"], given["y"], list(seeds),
                    request["spec"], **extra)
        changed = _changed(given, kept)
        if changed is not None:
            raise Unauditable(f"{train_name} modified {changed} in place: the audit's data "
                              "must stay as given (copy it before changing it)")
        return {"value": out}
    canaries = request.get("canaries")
    if canaries is not None:
        from . import dpsgd

        directions, included, mates = canaries
        extra["canaries"] = dpsgd.GradientCanaries(directions, included, mates=mates)
    out = guard(train_name, fn, given["X"], given["y"], list(seeds), request["spec"], **extra)
    if canaries is not None:
        reply = _canary_reply(out, len(seeds))
        reply["insertions"] = [tuple(i) for i in extra["canaries"].insertions]
    else:
        if not callable(out):
            raise Unauditable(f"train returned {type(out).__name__}, not a function; "
                              f"{CONTRACT}")
        n_classes, reply = int(y.max()) + 1, {"logits": []}
        for k, rows in enumerate(request["rows"]):
            kept[f"x{k}"], given[f"x{k}"] = rows, rows.to(X.dtype).clone()
            with torch.no_grad():
                z = guard(predict_name, out, given[f"x{k}"])
            reply["logits"].append(_logits_reply(z, len(seeds), len(rows), n_classes))
    changed = _changed(given, kept)
    if changed is not None:
        what = "rows x of predict(x)" if changed.startswith("x") else changed
        raise Unauditable(f"{train_name} modified {what} in place: the audit's data must "
                          "stay as given (copy it before changing it)")
    return reply


def in_process(fn, X, y, request: dict, limit: float | None) -> dict:
    """:func:`serve` in this process, each call a :func:`user_call` under ``limit``."""
    return serve(fn, X, y, request, lambda call, f, *a, **k: user_call(call, limit, f, *a, **k))


# ---- the worker process ---------------------------------------------------------------------

_HEADER = struct.Struct("<Q")
#: Seconds a worker may take to start (import torch and the training function's module).
START_LIMIT = 600.0


def _send(fd: int, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes | None:
    """``size`` bytes from ``fd``; None at end of file; TimeoutError past ``deadline``."""
    chunks, left = [], size
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None):
    """The next message on ``fd``; EOFError where the writer is gone."""
    header = _read_exactly(fd, _HEADER.size, deadline)
    if header is None:
        raise EOFError
    body = _read_exactly(fd, _HEADER.unpack(header)[0], deadline)
    if body is None:
        raise EOFError
    return pickle.loads(body)


def _children() -> list[int]:
    """The live (or unreaped) child processes of this process (Linux; elsewhere none seen)."""
    pids = []
    try:
        for task in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{task}/children") as f:
                pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    return pids


class _Failed(Exception):
    """In the worker: the user's call failed; ``what`` and ``trace`` go back to the auditor."""

    def __init__(self, call: str, what: str, trace: str = ""):
        super().__init__(call)
        self.call, self.what, self.trace = call, what, trace


def _worker_guard(out_fd: int, pid: int):
    """The worker's ``guard``: says which call runs (the auditor's timer restarts), makes
    it, and turns every way it can go wrong into :class:`_Failed`."""
    def guard(call, fn, *args, **kwargs):
        _send(out_fd, ("call", call))
        try:
            result = fn(*args, **kwargs)
            failure = None
        except BaseException as exc:  # noqa: BLE001  (SystemExit, KeyboardInterrupt too)
            result, failure = None, describe(exc)
        if os.getpid() != pid:  # a child the user's code forked, returning here: gone
            os._exit(0)
        if failure is not None:
            raise _Failed(call, *failure)
        forked = _children()
        if forked:
            raise _Failed(call, f"forked process(es) {forked} that outlived the call (the "
                                "audited code must run in the process it is called in)")
        return result
    return guard


def _orphaned(parent: int) -> None:
    """Kill this process group once the auditor is gone (killed, say, before it could kill
    the worker), however long the user's code would run."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _main() -> None:
    """The worker: protocol on the pipes of its stdin and stdout, moved to other
    descriptors (the user's prints go to stderr, its stdin reads nothing)."""
    if os.getpgrp() != os.getpid():  # started without a session of its own
        os.setsid()
    in_fd, out_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    pid = os.getpid()
    guard = _worker_guard(out_fd, pid)
    threading.Thread(target=_orphaned, args=(os.getppid(),), daemon=True).start()
    import torch

    try:  # a callable sent by reference is imported as it is unpickled
        _, target, threads = _receive(in_fd)
        torch.set_num_threads(threads)
        fn = import_target(target) if isinstance(target, str) else target
    except BaseException as exc:  # noqa: BLE001
        _send(out_fd, ("failed", "import of the training function", *describe(exc)))
        return
    _send(out_fd, ("ready",))
    data = None
    while True:
        try:
            kind, *body = _receive(in_fd)
        except EOFError:
            return
        if kind == "data":
            data = body
            continue
        try:
            _send(out_fd, ("reply", serve(fn, *data, body[0], guard)))
        except _Failed as exc:
            _send(out_fd, ("failed", exc.call, exc.what, exc.trace))
        except Unauditable as exc:
            _send(out_fd, ("unauditable", str(exc)))
        except Exception:  # dpaudit's own code failed: its traceback, for a bug report
            _send(out_fd, ("error", traceback.format_exc()))


class Worker:
    """A worker process for one training function (module docstring): ``target`` a
    ``"module.path:function"`` (imported there) or a picklable callable; ``function``: the
    same function loaded here, for what the auditor reads of it without calling it (its
    signature), by default ``target`` itself; ``threads``: torch's threads in the worker
    (and OMP's). Started at the first :meth:`call`, ended by :meth:`close` (a context
    manager too), or killed with its process group by a failure or a call past its limit."""

    def __init__(self, target, function=None, threads: int = 1):
        if function is None and isinstance(target, str):
            raise ValueError("Worker: give the loaded function of a 'module:function' target")
        self.target, self.function, self.threads = target, function or target, int(threads)
        self._proc, self._data = None, None

    def __repr__(self) -> str:
        return f"Worker({self.target!r})"

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self, limit: float | None) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
                   OMP_NUM_THREADS=str(self.threads), MKL_NUM_THREADS=str(self.threads))
        self._proc = subprocess.Popen([sys.executable, "-m", "dpaudit.user_code"],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      start_new_session=True, env=env)
        self._data = None
        try:
            _send(self._proc.stdin.fileno(), ("start", self.target, self.threads))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            self.close()
            raise ValueError(f"the training function {self.target!r} cannot be sent to the "
                             f"worker process by reference ({exc}); define it at the top "
                             "level of an importable module") from None
        # Starting takes seconds (torch's import), whatever a call's limit.
        self._await("import of the training function",
                    max(limit or START_LIMIT, START_LIMIT), "ready")

    def _await(self, call: str, limit: float | None, want: str):
        """The worker's next answer of kind ``want``, each ``("call", name)`` on the way
        restarting the limit for the call it names; else :class:`UserCodeFailed` (the
        worker killed first) or :class:`Unauditable`."""
        fd = self._proc.stdout.fileno()
        while True:
            deadline = time.monotonic() + limit if limit else None
            try:
                kind, *body = _receive(fd, deadline)
            except TimeoutError:
                self.close()
                raise UserCodeFailed(call, True, limit) from None
            except EOFError:
                raise UserCodeFailed(call, what=self._ended()) from None
            if kind == "call":
                call = body[0]
            elif kind == want:
                return body[0] if body else None
            elif kind == "unauditable":
                raise Unauditable(body[0])
            elif kind == "error":
                self.close()
                raise RuntimeError(f"dpaudit's worker process failed:\n{body[0]}")
            else:  # "failed": the worker's state is the user code's; start afresh next time
                self.close()
                raise UserCodeFailed(body[0], what=body[1], trace=body[2])

    def _ended(self) -> str:
        """What ended the worker, once it is gone."""
        code = self._proc.wait()
        self.close()
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            return f"ended its process: killed by signal {name}"
        return (f"ended its process with exit status {code} (e.g. os._exit({code})); "
                "a training function must return")

    def call(self, X, y, request: dict, limit: float | None) -> dict:
        """:func:`serve` of ``request`` on (X, y) in the worker (started if need be; X and y
        sent when they are not those of the last call), each call of the user's code
        limited to ``limit`` seconds (None or 0: none)."""
        if self._proc is None:
            self._start(limit)
        fd = self._proc.stdin.fileno()
        try:
            if self._data is None or self._data[0] is not X or self._data[1] is not y:
                _send(fd, ("data", X, y))
                self._data = (X, y)
            _send(fd, ("serve", request))
        except BrokenPipeError:
            raise UserCodeFailed(request["names"][0], what=self._ended()) from None
        return self._await(request["names"][0], limit, "reply")

    def close(self) -> None:
        """Kill the worker and every process of its group; wait for it."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


def call(fn, X, y, request: dict, limit: float | None) -> dict:
    """``request`` served by ``fn``: a :class:`Worker`'s call, or :func:`in_process`."""
    if isinstance(fn, Worker):
        return fn.call(X, y, request, limit)
    return in_process(fn, X, y, request, limit)


def function_of(fn):
    """The function itself, for what is read of it without a call (its signature, whether
    it is a registry subject): a :class:`Worker`'s ``function``, else ``fn``."""
    return fn.function if isinstance(fn, Worker) else fn


if __name__ == "__main__":
    _main()

# sandgate's resident Python runner: the waiting interpreter of a pooled sandbox.
#
# Run by sandbox-init as `python3 -c <this> READY_LINE MODULE...` with the sandbox's base
# environment. It imports (and warms) the preload modules, prints READY_LINE on stdout, then
# reads one JSON line on stdin (sandbox_protocol::RunnerJob: argv, cwd, env), and runs argv[1]
# exactly as `python3 argv[1] argv[2:]...` would: as __main__, sys.argv = argv[1:], sys.path[0]
# its directory, in cwd, with exactly env, stdin /dev/null, the streams unbuffered as the
# environment says, the same exit status (SystemExit, an uncaught exception: 1 with the
# traceback, KeyboardInterrupt: killed by SIGINT). It serves one program, then the interpreter
# ends: each sandbox serves one execution, so nothing the preload left can reach another.
# The end is the interpreter's own exit sequence (non-daemon threads joined, atexit handlers,
# unclosed files flushed, the program's globals released so that finalizers run, a garbage
# collection, the standard streams flushed; daemon threads silenced) without its last step,
# tearing down every preloaded module:
# with pandas and matplotlib loaded that alone took ~1.5 s inside gVisor here, for nothing
# any program can observe.
# Rather than forking one child per job, the waiting interpreter runs the program itself:
# with one execution per sandbox a fork would only cost time. Differences from a cold run that
# remain, by design: the preloaded modules are already in sys.modules (an uploaded pandas.py
# does not shadow them), and /tmp holds matplotlib's font cache.
import sys


def _preload(modules):
    for name in modules:
        try:
            __import__(name)
        except Exception as err:  # a missing module is the program's business, not the pool's
            sys.stderr.write("sandgate-runner: preload %s: %s\n" % (name, err))
    # The first use costs too: matplotlib's first figure loads fonts and the Agg backend.
    if "matplotlib" in modules:
        try:
            import io
            import matplotlib.pyplot as plt

            figure = plt.figure()
            figure.gca().plot([0, 1], [0, 1])
            figure.savefig(io.BytesIO(), format="png")
            plt.close(figure)
        except Exception as err:
            sys.stderr.write("sandgate-runner: warming matplotlib: %s\n" % err)
    if "pandas" in modules:
        try:
            import io
            import pandas

            pandas.read_csv(io.StringIO("a,b\n1,2\n")).describe()
        except Exception as err:
            sys.stderr.write("sandgate-runner: warming pandas: %s\n" % err)


def _reseed():
    """Generators the preload seeded, seeded again from the kernel now that a job has come: a
    waiting sandbox may be one of many restored from one checkpoint (the pool's refill by
    restore), and siblings must not draw the same numbers. A fresh interpreter seeds them at
    start; this makes the restored one the same. (Generators a preloaded library made for
    itself, the string-hash secret and the address-space layout stay the checkpoint's.)"""
    random = sys.modules.get("random")
    if random is not None:
        random.seed()
    tempfile = sys.modules.get("tempfile")
    if tempfile is not None:
        tempfile._name_sequence = None
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        try:
            numpy_random.seed()
        except Exception as err:
            sys.stderr.write("sandgate-runner: reseeding numpy.random: %s\n" % err)


def _trimmed_hook(program):
    """The interpreter's own report of an uncaught exception, from the program's frames on (the
    runner's are not the program's business). A program may install its own sys.excepthook."""

    def hook(kind, value, tb):
        first = tb
        while first is not None and first.tb_frame.f_code.co_filename != program:
            first = first.tb_next
        if value is not None:
            value.__traceback__ = first
        sys.__excepthook__(kind, value, first)

    return hook


def _run():
    import builtins
    import json
    import os
    import types
    from importlib.machinery import SourceFileLoader

    ready, modules = sys.argv[1], sys.argv[2:]
    # What `_finish` imports, imported now: a program that used up its open files (or its
    # memory) must still end as python3 ends, without the exit path opening a module file.
    import atexit, io, signal, threading  # noqa: E401,F401

    _preload(modules)
    sys.stdout.write(ready + "\n")
    sys.stdout.flush()
    job = json.loads(sys.stdin.readline())
    _reseed()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    program = job["argv"][1]
    sys.argv = job["argv"][1:]
    sys.path[0] = os.path.dirname(program)
    # The program's __main__, as `python3 program` makes it (and it stays __main__ for the
    # program's threads and atexit handlers). Exceptions are left to the interpreter: exit 1
    # with the traceback, SystemExit's code, death by SIGINT after KeyboardInterrupt.
    main = types.ModuleType("__main__")
    main.__file__ = program
    main.__loader__ = SourceFileLoader("__main__", program)
    main.__spec__ = None
    main.__package__ = None
    main.__builtins__ = builtins
    main.__cached__ = None
    sys.modules["__main__"] = main
    sys.excepthook = _trimmed_hook(program)
    # What the preload made is left out of every collection from here on (and of the program's).
    import gc

    gc.freeze()
    preloaded = set(sys.modules)
    interrupted = False
    try:
        with open(program, "rb") as source:
            code = compile(source.read(), program, "exec")
        exec(code, main.__dict__)
        status = 0
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:  # reported as the interpreter reports an uncaught exception
        kind, value, tb = sys.exc_info()
        interrupted = isinstance(value, KeyboardInterrupt)
        sys.excepthook(kind, value, tb)
        del kind, value, tb
        status = 1
    _finish(status, interrupted, main, preloaded, os.path.dirname(program))


def _exit_status(code):
    """SystemExit's code as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        # As the interpreter: a C long, -1 when it does not fit; the low byte is the status.
        if not -(2**63) <= code < 2**63:
            return 0xFF
        return code & 0xFF
    try:
        sys.stderr.write(str(code) + "\n")
    except Exception:
        pass
    return 1


def _finish(status, interrupted, main, preloaded, program_dir):
    """The interpreter's exit, in its order, up to (not including) tearing down every module."""
    import atexit
    import gc
    import os
    import signal
    import threading

    threading._shutdown()
    atexit._run_exitfuncs()
    # From here on, as in the interpreter's finalization, a daemon thread still running is
    # done: it no longer gets the CPU for long, and what it raises is not reported.
    sys.setswitchinterval(1000.0)
    threading.excepthook = lambda args: None
    # Files the program never closed are written, as their finalizers would at teardown.
    import io

    for found in gc.get_objects():
        if isinstance(found, io.IOBase):
            try:
                if not found.closed:
                    found.flush()
            except Exception:
                pass
    # Release the program's globals, as teardown does, so that its finalizers run (a gzip or
    # zip file left open is completed).
    builtins = main.__dict__.get("__builtins__")
    main.__dict__.clear()
    main.__dict__["__builtins__"] = builtins
    for name in [name for name in sys.modules if name not in preloaded]:
        module = sys.modules.get(name)
        source = getattr(module, "__file__", None) or ""
        if source.startswith(program_dir + os.sep):
            module.__dict__.clear()
    gc.collect()
    # As the interpreter flushes its standard files: closed or missing ones are skipped; one
    # that cannot be written makes the status 120.
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        if stream is None or getattr(stream, "closed", False):
            continue
        try:
            stream.flush()
        except Exception:
            status = 120
    if interrupted:
        # Death by SIGINT after KeyboardInterrupt, as python3 ends.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


_run()

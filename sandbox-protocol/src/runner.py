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


def _run():
    import json
    import os
    import runpy
    import traceback

    ready, modules = sys.argv[1], sys.argv[2:]
    _preload(modules)
    sys.stdout.write(ready + "\n")
    sys.stdout.flush()
    job = json.loads(sys.stdin.readline())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    program = job["argv"][1]
    sys.argv = job["argv"][1:]
    sys.path[0] = os.path.dirname(program)
    try:
        runpy.run_path(program, run_name="__main__")
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as err:
        # The traceback python3 main.py would print: from the program's frames on.
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != program:
            tb = tb.tb_next
        traceback.print_exception(type(err), err, tb or err.__traceback__)
        sys.stderr.flush()
        sys.exit(1)


_run()

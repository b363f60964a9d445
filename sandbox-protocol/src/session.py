# sandgate's Python session runner: one interpreter serving every turn of a session.
#
# Run by sandbox-init (`session python`) as `python3 -c <this>` in /workspace with the
# session's environment. It reads turns on stdin (sandbox_protocol::RunnerTurn JSON lines:
# program, nonce) and gives the cells fd 0 = /dev/null. Each cell is executed in the one
# globals dict (as __main__): globals, imports, open files and threads persist. When the cell
# ends with an expression, its repr (cut to MAX_RESULT_BYTES) is the turn's result. An
# exception prints its traceback (from the cell's frames on) and ends the turn with 1;
# SystemExit ends it with its code; SIGINT while a cell runs raises KeyboardInterrupt (130).
# Between cells SIGINT is ignored, so an interrupt that comes late never kills the runner.
# Then the end marker `\0sandgate-end:<nonce>:<code>:<base64 result>\n` goes to stdout and
# stderr, after everything the cell printed.
import sys

MAX_RESULT_BYTES = 64 * 1024


def _trimmed(err, program):
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename != program:
        tb = tb.tb_next
    return tb or err.__traceback__


def _cell(namespace, program):
    import ast
    import base64
    import signal
    import traceback

    with open(program, encoding="utf-8") as source_file:
        source = source_file.read()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        tree = ast.parse(source, program, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, program, "exec"), namespace)
        if last is None:
            return 0, ""
        value = eval(compile(last, program, "eval"), namespace)
        if value is None:
            return 0, ""
        text = repr(value).encode("utf-8", "replace")[:MAX_RESULT_BYTES]
        return 0, base64.b64encode(text).decode("ascii")
    except SystemExit as err:
        code = err.code
        if code is None:
            return 0, ""
        if isinstance(code, int):
            return code & 0xFF, ""
        sys.stderr.write("%s\n" % code)
        return 1, ""
    except KeyboardInterrupt as err:
        traceback.print_exception(type(err), err, _trimmed(err, program))
        return 130, ""
    except BaseException as err:
        traceback.print_exception(type(err), err, _trimmed(err, program))
        return 1, ""
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def _serve():
    import json
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    turns = os.fdopen(os.dup(0), "r", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.path[0] = os.getcwd()
    sys.argv = [""]
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    for line in turns:
        turn = json.loads(line)
        code, result = _cell(namespace, turn["program"])
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        marker = "\0sandgate-end:%s:%d:%s\n" % (turn["nonce"], code, result)
        for stream in (sys.__stdout__, sys.__stderr__):
            stream.write(marker)
            stream.flush()


_serve()

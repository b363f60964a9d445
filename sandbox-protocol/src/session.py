# sandgate's Python session runner: one interpreter serving every turn of a session.
#
# Run by sandbox-init (`session python`) as `python3 -c <this>` in /workspace with the
# session's environment. Its fd 0 is the channel to the init (a socket): first one line, the
# session's report key, then one line per cell, `<seq> <program>`. The cells get fd 0 =
# /dev/null; the channel moves to a descriptor of its own. Each cell is executed in the one
# globals dict (as __main__): globals, imports, open files and threads persist. When the cell
# ends with an expression, its repr (cut to MAX_RESULT_BYTES) is the turn's result. An
# exception prints its traceback (from the cell's frames on) and ends the turn with 1;
# SystemExit ends it with its code; SIGINT while a cell runs raises KeyboardInterrupt (130).
# Between cells SIGINT is ignored, so an interrupt that comes late never kills the runner.
# Then the report `\n<key>:<seq>:<code>:<base64 result>\n` goes to the channel, after the
# standard streams were flushed; the init, which reads the streams through pipes, writes the
# turn's end markers (the runner never sees a turn's nonce).
#
# Everything the loop calls is taken before the first cell runs and held in this closure:
# a cell that replaces json.loads, repr, os.write, base64 or sys.stdout cannot change what is
# reported for a later cell, and the key never leaves the loop's own frame. (A cell can still
# read that frame on purpose; see sandbox_protocol's session module.)


def _runner():
    import ast
    import base64
    import builtins
    import os
    import signal
    import sys
    import traceback

    MAX_RESULT_BYTES = 64 * 1024
    b64encode, parse, Expr, Expression = base64.b64encode, ast.parse, ast.Expr, ast.Expression
    compile_, exec_, eval_, repr_, open_ = (
        builtins.compile,
        builtins.exec,
        builtins.eval,
        builtins.repr,
        builtins.open,
    )
    isinstance_, int_, bytes_ = builtins.isinstance, builtins.int, builtins.bytes
    read, write, dup, dup2, close = os.read, os.write, os.dup, os.dup2, os.close
    set_signal, SIGINT, SIG_IGN = signal.signal, signal.SIGINT, signal.SIG_IGN
    default_int_handler = signal.default_int_handler
    print_exception = traceback.print_exception
    streams = (sys.__stdout__, sys.__stderr__)

    def trimmed(err, program):
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != program:
            tb = tb.tb_next
        return tb or err.__traceback__

    def cell(namespace, program):
        with open_(program, encoding="utf-8") as source_file:
            source = source_file.read()
        set_signal(SIGINT, default_int_handler)
        try:
            tree = parse(source, program, "exec")
            last = None
            if tree.body and isinstance_(tree.body[-1], Expr):
                last = Expression(tree.body.pop().value)
            exec_(compile_(tree, program, "exec"), namespace)
            if last is None:
                return 0, ""
            value = eval_(compile_(last, program, "eval"), namespace)
            if value is None:
                return 0, ""
            text = repr_(value).encode("utf-8", "replace")[:MAX_RESULT_BYTES]
            return 0, b64encode(text).decode("ascii")
        except SystemExit as err:
            code = err.code
            if code is None:
                return 0, ""
            if isinstance_(code, int_):
                return code & 0xFF, ""
            sys.stderr.write("%s\n" % code)
            return 1, ""
        except KeyboardInterrupt as err:
            print_exception(type(err), err, trimmed(err, program))
            return 130, ""
        except BaseException as err:
            print_exception(type(err), err, trimmed(err, program))
            return 1, ""
        finally:
            set_signal(SIGINT, SIG_IGN)

    def flush():
        for stream in (sys.stdout, sys.stderr) + streams:
            try:
                stream.flush()
            except BaseException:
                pass

    def serve():
        set_signal(SIGINT, SIG_IGN)
        channel = dup(0)
        null = os.open(os.devnull, os.O_RDONLY)
        dup2(null, 0)
        close(null)
        sys.path[0] = os.getcwd()
        sys.argv = [""]
        namespace = {"__name__": "__main__", "__builtins__": builtins}
        pending = bytes_()

        def line():
            nonlocal pending
            while b"\n" not in pending:
                chunk = read(channel, 4096)
                if not chunk:
                    return None
                pending += chunk
            found, _, pending = pending.partition(b"\n")
            return found.decode("utf-8")

        key = line()
        while key is not None:
            received = line()
            if received is None:
                return
            seq, _, program = received.partition(" ")
            code, result = cell(namespace, program)
            flush()
            report = ("\n%s:%s:%d:%s\n" % (key, seq, code, result)).encode("ascii")
            while report:
                report = report[write(channel, report) :]

    return serve


_runner()()

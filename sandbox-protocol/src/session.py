# sandgate's Python session runner: one interpreter serving every turn of a session.
#
# Run by sandbox-init (`session python`) as `python3 -c <this>` in /workspace with the
# session's environment. Its fd 0 is the channel to the init (a socket): first one line, the
# session's report key, then one line per cell, `<seq> <program>`. The cells get fd 0 =
# /dev/null; the channel moves to a descriptor of its own. Each cell is executed in the one
# globals dict (as __main__): globals, imports, open files and threads persist. When the cell
# ends with an expression, its repr (cut to MAX_RESULT_BYTES) is the turn's result, and its
# MIME bundle (text/plain plus what _repr_html_, _repr_json_, _repr_png_, ... give) with the
# figures the cell displayed through matplotlib (plt.show(), and those left open at its end,
# as PNG: an inline backend of this runner's own) are its rich results, as Jupyter shows them,
# at most MAX_RESULTS_BYTES of JSON (whole values left out beyond, `truncated`). An
# exception prints its traceback (from the cell's frames on) and ends the turn with 1;
# SystemExit ends it with its code; SIGINT while a cell runs raises KeyboardInterrupt (130).
# Between cells SIGINT is ignored, so an interrupt that comes late never kills the runner.
# Then the report `\n<key>:<seq>:<code>:<base64 result>:<base64 results>\n` goes to the channel, after the
# standard streams were flushed; the init, which reads the streams through pipes, writes the
# turn's end markers (the runner never sees a turn's nonce).
#
# Everything the loop calls is taken before the first cell runs and held in this closure:
# a cell that replaces json.loads, repr, os.write, base64 or sys.stdout cannot change what is
# reported for a later cell, and the key never leaves the loop's own frame. (A cell can still
# read that frame on purpose; see sandbox_protocol's session module.) The rich results' JSON
# is assembled with string formatting from base64 text, not with the json module; only a
# `_repr_json_` value is encoded by a json encoder made before the first cell.


def _runner():
    import ast
    import base64
    import builtins
    import os
    import signal
    import sys
    import traceback

    import io
    import json
    import types

    MAX_RESULT_BYTES = 64 * 1024
    MAX_RESULTS_BYTES = 4 * 1024 * 1024
    b64encode, parse, Expr, Expression = base64.b64encode, ast.parse, ast.Expr, ast.Expression
    getattr_, callable_, str_, tuple_, len_, type_ = (
        builtins.getattr,
        builtins.callable,
        builtins.str,
        builtins.tuple,
        builtins.len,
        builtins.type,
    )
    Exception_ = builtins.Exception
    encode_json = json.JSONEncoder(ensure_ascii=True, default=str).encode
    modules, BytesIO, ModuleType = sys.modules, io.BytesIO, types.ModuleType
    # What a value may say of itself, as IPython asks it (binary ones give bytes or base64).
    REPRS = (
        ("text/html", "_repr_html_"),
        ("text/markdown", "_repr_markdown_"),
        ("image/svg+xml", "_repr_svg_"),
        ("image/png", "_repr_png_"),
        ("image/jpeg", "_repr_jpeg_"),
        ("application/pdf", "_repr_pdf_"),
        ("text/latex", "_repr_latex_"),
        ("application/json", "_repr_json_"),
        ("application/javascript", "_repr_javascript_"),
    )
    BINARY = ("image/png", "image/jpeg", "application/pdf")
    shown = []
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

    def b64(text):
        if isinstance_(text, bytes_):
            return b64encode(text).decode("ascii")
        return b64encode(text.encode("utf-8", "replace")).decode("ascii")

    def figure_bundle(figure):
        buffer = BytesIO()
        figure.savefig(buffer, format="png", bbox_inches="tight")
        width, height = figure.get_size_inches() * figure.dpi
        text = "<Figure size %gx%g with %d Axes>" % (width, height, len_(figure.axes))
        return [("text/plain", text), ("image/png", b64(buffer.getvalue()))]

    def show_figures(*args, **kwargs):
        # The inline backend's show(): every open figure becomes a displayed PNG, then closes.
        pyplot = modules.get("matplotlib.pyplot")
        if pyplot is None:
            return
        for number in pyplot.get_fignums():
            figure = pyplot.figure(number)
            try:
                shown.append((False, figure_bundle(figure)))
            except Exception_:
                pass
            pyplot.close(figure)

    inline = ModuleType("sandgate_inline")
    inline.show = show_figures
    modules["sandgate_inline"] = inline

    class InlineBackend:
        # Chooses the inline backend when pyplot is first imported (matplotlib is then
        # imported already; pyplot reads the backend when it draws its first figure).
        def find_spec(self, name, path=None, target=None):
            if name == "matplotlib.pyplot" and "matplotlib" in modules:
                try:
                    from matplotlib.backends.backend_agg import FigureCanvasAgg

                    inline.FigureCanvas = FigureCanvasAgg
                    modules["matplotlib"].use("module://sandgate_inline")
                except Exception_:
                    pass
            return None

    sys.meta_path.insert(0, InlineBackend())

    def bundle(value, text):
        data = [("text/plain", text)]
        kind = type_(value)
        if kind.__name__ == "Figure" and kind.__module__.startswith("matplotlib"):
            try:
                return figure_bundle(value)
            except Exception_:
                return data
        for mime, method in REPRS:
            try:
                function = getattr_(value, method, None)
                said = function() if callable_(function) else None
                if isinstance_(said, tuple_):
                    said = said[0] if said else None
                if said is None:
                    continue
                if mime == "application/json":
                    said = encode_json(said)
                elif mime in BINARY and isinstance_(said, bytes_):
                    said = b64encode(said).decode("ascii")
                if isinstance_(said, str_):
                    data.append((mime, said))
            except Exception_:
                pass
        return data

    def rich(main):
        # `main`: what comes before the figures still in `shown`.
        # JSON made by formatting base64 text: no json module a cell could replace.
        parts, size, truncated = [], 0, False
        for is_main, data in main + shown[:]:
            fields = []
            for mime, value in data:
                field = '"%s":"%s"' % (mime, b64(value))
                if size + len_(field) > MAX_RESULTS_BYTES:
                    truncated = True
                    continue
                size += len_(field) + 1
                fields.append(field)
            parts.append('{"main":%s,"data":{%s}}' % ("true" if is_main else "false", ",".join(fields)))
        del shown[:]
        if not parts:
            return ""
        text = '{"results":[%s],"truncated":%s}' % (",".join(parts), "true" if truncated else "false")
        return b64(text)

    def cell(namespace, program):
        code, result, main = run(namespace, program)
        try:
            # Jupyter's order: what the cell displayed, its value, then the figures left open.
            during = shown[:]
            del shown[:]
            show_figures()
            results = rich(during + main)
        except BaseException:
            del shown[:]
            results = ""
        return code, result, results

    def run(namespace, program):
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
                return 0, "", []
            value = eval_(compile_(last, program, "eval"), namespace)
            if value is None:
                return 0, "", []
            text = repr_(value).encode("utf-8", "replace")[:MAX_RESULT_BYTES]
            main = [(True, bundle(value, text))]
            return 0, b64encode(text).decode("ascii"), main
        except SystemExit as err:
            code = err.code
            if code is None:
                return 0, "", []
            if isinstance_(code, int_):
                return code & 0xFF, "", []
            sys.stderr.write("%s\n" % code)
            return 1, "", []
        except KeyboardInterrupt as err:
            print_exception(type(err), err, trimmed(err, program))
            return 130, "", []
        except BaseException as err:
            print_exception(type(err), err, trimmed(err, program))
            return 1, "", []
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
            code, result, results = cell(namespace, program)
            flush()
            report = ("\n%s:%s:%d:%s:%s\n" % (key, seq, code, result, results)).encode("ascii")
            while report:
                report = report[write(channel, report) :]

    return serve


_runner()()

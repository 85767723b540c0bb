"""What every rank runs first: `python bootstrap.py STACKS TRACER ENTRY...` (bootstrap_body.py says what it
does). Python compiles the script it is given anew at every start and caches no bytecode for it, so this
file stays a few lines: it runs bootstrap_body.py's code, which the import system's bytecode cache keeps
(__pycache__ beside it, one per Python version), as its own. Compiling the body instead cost every rank
~2 ms of CPU at its start."""

_START = dict(globals())  # what Python gave this __main__ (before any import): the entry's starts the same
_BODY = __file__[:-3] + "_body.py"


def _body():
    try:  # the import system's own loader, already loaded at every start: the cached bytecode, or compiled and cached
        from _frozen_importlib_external import SourceFileLoader

        return SourceFileLoader("__main__", _BODY).get_code("__main__")
    except ImportError:  # another Python than CPython
        with open(_BODY, "rb") as fh:
            return compile(fh.read(), _BODY, "exec", dont_inherit=True)


try:
    exec(_body())
except BaseException as exc:
    # the body's _cut: this file's frame and the body's go; a bare raise adds no frame, so the interpreter's
    # top level sees the entry's own traceback (and an uncaught KeyboardInterrupt still ends it by SIGINT)
    exc.__traceback__ = _cut(exc.__traceback__)  # noqa: F821
    del exc
    raise

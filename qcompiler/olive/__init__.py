"""qcompiler as a pass of Microsoft Olive (`pip install 'qcompiler[olive]'`; docs/olive.md).

Olive finds a pass only through a package config, and the one a workflow is given replaces Olive's own list, so
`package_config()` returns Olive's default list with `QcompilerQuantization` added:

    from olive.workflows import run
    from qcompiler.olive import package_config
    run(workflow, package_config=package_config())
"""
try:
    import olive  # noqa: F401
except ImportError as e:   # one line naming the fix, not a traceback from deep inside a workflow
    raise ImportError("qcompiler.olive needs Olive: pip install 'qcompiler[olive]' (olive-ai)") from e

from qcompiler.olive.package import PASS_NAME, package_config, pass_entry

__all__ = ["PASS_NAME", "package_config", "pass_entry"]

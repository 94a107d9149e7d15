"""Every Python package of the source tree is listed in setup.cfg, so a regular (non-editable) install ships it
(an editable install finds unlisted subpackages by path, which hid a missing qcompiler.quant.placement)."""
import configparser
import os

from tests.helpers import ROOT


def test_every_package_is_listed_in_setup_cfg():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    listed = {p.strip() for p in cfg["options"]["packages"].split() if p.strip()}
    roots = {"qcompiler": "qcompiler", "qcompiler.passes": "passes", "qcompiler.patterns": "patterns"}
    found = set()
    for pkg, folder in roots.items():
        base = os.path.join(ROOT, folder)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, base)
                found.add(pkg if rel == "." else pkg + "." + rel.replace(os.sep, "."))
    assert found - listed == set(), sorted(found - listed)

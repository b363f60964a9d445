"""sandgate: `pip install x` installs into PYTHONUSERBASE, and x imports at once.

Installed into the image's /usr/lib/python3/dist-packages with `sandgate_user_site.pth`, so
every interpreter runs it at start-up. The root file system is read-only and the program is not
root, so pip falls back to a user installation under PYTHONUSERBASE (the gateway sets
/workspace/.local). Python's `site` puts that site-packages on sys.path only if it already
exists when the interpreter starts; a program that runs `pip install six` and then `import six`,
or a warm sandbox's interpreter started before its job, would not find it. This puts it where
`site` would have (before the system's packages, so an upgraded package wins) without creating
it: a finder for that one directory reads it again once pip has created or changed it.

Does nothing under `python3 -s`/`-I`, with PYTHONNOUSERSITE, without PYTHONUSERBASE, or when the
directory existed at start-up (then `site` added it itself).
"""

import os
import site
import sys
from importlib import machinery


def _finder_for(user_site):
    loaders = [
        (machinery.ExtensionFileLoader, machinery.EXTENSION_SUFFIXES),
        (machinery.SourceFileLoader, machinery.SOURCE_SUFFIXES),
        (machinery.SourcelessFileLoader, machinery.BYTECODE_SUFFIXES),
    ]

    def hook(path):
        if path != user_site:
            raise ImportError("only the user site", path=path)
        # A FileFinder lists its directory again whenever the directory's mtime changes, and
        # treats a missing one as empty: it sees what pip installs later.
        return machinery.FileFinder(path, *loaders)

    return hook


def _enable_user_site():
    if not site.ENABLE_USER_SITE or not os.environ.get("PYTHONUSERBASE"):
        return
    user_site = site.getusersitepackages()
    if user_site in sys.path:
        return
    sys.path_hooks.insert(0, _finder_for(user_site))
    sys.path_importer_cache.pop(user_site, None)
    system = [i for i, p in enumerate(sys.path) if p.endswith(("dist-packages", "site-packages"))]
    sys.path.insert(system[0] if system else len(sys.path), user_site)


_enable_user_site()

"""sandgate: `pip install x` installs into PYTHONUSERBASE, and x imports at once.

Installed into the image's /usr/lib/python3/dist-packages with `sandgate_user_site.pth`, so
every interpreter runs it at start-up. The root file system is read-only and the program is not
root, so pip falls back to a user installation under PYTHONUSERBASE (the gateway sets
/workspace/.local). Python's `site` puts that directory on sys.path only if it already exists
when the interpreter starts; a program that runs `pip install six` and then `import six`, or a
warm sandbox's interpreter started before the job, would not find it. This creates it and puts
it where `site` would have: before the system's packages, so an upgraded package wins.

Does nothing under `python3 -s`/`-I`, PYTHONNOUSERSITE, or without PYTHONUSERBASE.
"""

import os
import site
import sys


def _enable_user_site():
    if not site.ENABLE_USER_SITE or not os.environ.get("PYTHONUSERBASE"):
        return
    user_site = site.getusersitepackages()
    if user_site in sys.path:
        return
    try:
        os.makedirs(user_site, exist_ok=True)
    except OSError:
        return
    system = [i for i, p in enumerate(sys.path) if p.endswith(("dist-packages", "site-packages"))]
    site.addsitedir(user_site)
    if system and user_site in sys.path:
        sys.path.remove(user_site)
        sys.path.insert(system[0], user_site)


_enable_user_site()

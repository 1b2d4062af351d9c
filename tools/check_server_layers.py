#!/usr/bin/env python3
"""The layering of mpsshim-server's folders (docs/architecture.md, "Folders of broker/server").

broker/server/ is cut into folders, one layer each, bottom to top:

    base, driver, images, launch, scheduling, accounting, session, ops, core

A file may include (#include "broker/server/...") headers of its own folder and of the folders
below it, never of a folder above. Exceptions, the only ones:

  * session/ is the hub. A Session holds the parts of launch/, scheduling/ and accounting/ as
    members, so session/session.hpp includes their headers and those folders sit below it; the
    .cpp files of these three folders implement operations over a whole session (taking a
    Session&, forward-declared in their headers) and may include headers of session/. Their
    headers may not.
  * accounting/session_stats.cpp and accounting/heap_profile.cpp may include ops/dispatch.hpp,
    for op_name(): the names of the operations live in the dispatch table.

Every file must sit in one of these folders (meson.build files excepted), and every
broker/server/ header a file includes must exist. Exits 1 naming each file, include and rule
broken; 0 when all hold.

Usage: check_server_layers.py [REPOSITORY_ROOT]   (default: the repository this script is in)
"""
import os
import re
import sys

LAYERS = ['base', 'driver', 'images', 'launch', 'scheduling', 'accounting', 'session', 'ops', 'core']
RANK = {name: i for i, name in enumerate(LAYERS)}
HUB = 'session'
HUB_CLIENTS = {'launch', 'scheduling', 'accounting'}  # their .cpp files may include session/
EXCEPTIONS = {  # (file, include), both relative to broker/server/
    ('accounting/session_stats.cpp', 'ops/dispatch.hpp'),
    ('accounting/heap_profile.cpp', 'ops/dispatch.hpp'),
}
SOURCE_SUFFIXES = ('.hpp', '.cpp', '.h', '.cc', '.inc')
INCLUDE = re.compile(r'^\s*#\s*include\s*"broker/server/([^"]+)"', re.M)


def rule_text():
    return ('folders bottom to top: ' + ' < '.join(LAYERS) +
            '; a file includes only its own folder and folders below')


def check(root):
    server = os.path.join(root, 'broker', 'server')
    problems = []
    checked = 0
    for dirpath, dirnames, filenames in os.walk(server):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, server).replace(os.sep, '/')
            if name == 'meson.build':
                continue
            parts = rel.split('/')
            folder = parts[0] if len(parts) > 1 else None
            if folder not in RANK or len(parts) != 2:
                problems.append(f'broker/server/{rel}: not in a layer folder ({", ".join(LAYERS)})')
                continue
            if not name.endswith(SOURCE_SUFFIXES):
                continue
            checked += 1
            with open(path, encoding='utf-8', errors='replace') as f:
                text = f.read()
            for m in INCLUDE.finditer(text):
                inc = m.group(1)
                line = text.count('\n', 0, m.start()) + 1
                where = f'broker/server/{rel}:{line}: includes "broker/server/{inc}"'
                if not os.path.isfile(os.path.join(server, inc)):
                    problems.append(f'{where}, which does not exist')
                    continue
                target = inc.split('/')[0] if '/' in inc else None
                if target not in RANK:
                    problems.append(f'{where}, which is not in a layer folder')
                    continue
                if RANK[target] <= RANK[folder]:
                    continue
                if (rel, inc) in EXCEPTIONS:
                    continue
                if target == HUB and folder in HUB_CLIENTS and name.endswith('.cpp'):
                    continue
                why = f'{folder}/ is below {target}/ ({rule_text()})'
                if target == HUB and folder in HUB_CLIENTS:
                    why += f'; only .cpp files of {", ".join(sorted(HUB_CLIENTS))} may include {HUB}/'
                problems.append(f'{where}: {why}')
    return checked, problems


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(
        os.path.dirname(os.path.abspath(__file__)))
    checked, problems = check(root)
    if checked == 0:
        print(f'no sources found under {root}/broker/server', file=sys.stderr)
        return 1
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f'{len(problems)} layering violation(s) in {checked} files', file=sys.stderr)
        return 1
    print(f'{checked} files under broker/server/ follow the layers: {" < ".join(LAYERS)}')
    return 0


if __name__ == '__main__':
    sys.exit(main())

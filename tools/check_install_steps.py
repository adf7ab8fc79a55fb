#!/usr/bin/env python3
"""The set-up contract, checked mechanically: every library, include path, package config and
executable a CMake build found must come from a Debian package that a new Debian 12 machine gets,
either in the base image (a plain debian:12 plus build-essential) or from tools/deps.sh, directly
or through a Depends. deps.sh installs with --no-install-recommends, so a Recommends does not
count. A package that only this machine happened to have is exactly what makes a configure fail on
a new one while CI here stays green.

  check_install_steps.py BUILD_DIR [DEPS_SCRIPT]

Exit 0 when every path is covered; exit 1 naming each offending package and the cache entry that
needs it; exit 2 when the check itself cannot run (no CMake cache, no dpkg). Reads only: it runs
`dpkg -S`, `apt-cache depends` and `apt-cache dumpavail`, and `DEPS_SCRIPT --list`.
"""
import os
import re
import subprocess
import sys

# Cache entries that name something found on this machine. Entries of type FILEPATH/PATH are what
# find_library/find_path/find_program write; *_DIR is what find_package(CONFIG) writes.
ENTRY = re.compile(r'^([A-Za-z0-9_.+-]+):(FILEPATH|PATH|STRING|INTERNAL)=(.*)$')
INTERESTING = re.compile(r'(LIBRARY|LIBRARIES|INCLUDE_DIR|INCLUDE_DIRS|_DIR|EXECUTABLE|PROGRAM|'
                         r'COMPILER|CCACHE|_AR|_RANLIB|_LINKER|_STRIP|_NM|_OBJCOPY|_OBJDUMP)')

SYSTEM_ROOTS = ('/usr/', '/lib', '/bin/', '/sbin/', '/opt/', '/etc/')


def fail(msg, code=2):
    print(f'check_install_steps: {msg}', file=sys.stderr)
    sys.exit(code)


def cache_paths(build):
    cache = os.path.join(build, 'CMakeCache.txt')
    if not os.path.exists(cache):
        fail(f'{cache} does not exist: configure the build first')
    out = {}
    build_abs = os.path.realpath(build)
    for line in open(cache, errors='replace'):
        m = ENTRY.match(line.strip())
        if not m or m.group(1).startswith('CMAKE_INSTALL_'):
            continue
        if m.group(2) not in ('FILEPATH', 'PATH') and not INTERESTING.search(m.group(1)):
            continue
        for value in m.group(3).split(';'):
            # The system's own trees; the source and build folders are the project's.
            if not value.startswith(SYSTEM_ROOTS) or value.endswith('-NOTFOUND'):
                continue
            if not os.path.exists(value) or os.path.realpath(value).startswith(build_abs):
                continue
            out.setdefault(value, m.group(1))
    return out


def owners_of(path):
    """Packages that own `path` (or, for an alternatives symlink, the file it resolves to)."""
    for candidate in (path, os.path.realpath(path)):
        r = subprocess.run(['dpkg', '-S', candidate], capture_output=True, text=True)
        pkgs = set()
        for line in r.stdout.splitlines():
            if line.startswith('diversion by'):
                continue
            head, sep, owned = line.partition(': ')
            if sep and owned.strip() == candidate:
                pkgs.update(p.strip().split(':')[0] for p in head.split(','))
        if pkgs:
            return pkgs
    return set()


def closure(roots):
    """Everything apt installs for `roots` without Recommends: the first alternative of each
    Depends/PreDepends group, a virtual package through its first provider."""
    if not roots:
        return set()
    r = subprocess.run(['apt-cache', 'depends', '--recurse', '--no-recommends', '--no-suggests',
                        '--no-conflicts', '--no-breaks', '--no-replaces', '--no-enhances'] +
                       sorted(roots), capture_output=True, text=True)
    graph, providers = {}, {}
    pkg, groups, alt, last_virtual = None, None, [], None
    for raw in r.stdout.splitlines():
        if not raw.startswith(' '):
            pkg = raw.strip()
            groups = graph.setdefault(pkg, [])
            alt, last_virtual = [], None
            continue
        line = raw.strip()
        m = re.match(r'^(\|?)(Depends|PreDepends): (.+)$', line)
        if m:
            alt.append(m.group(3))
            last_virtual = m.group(3) if m.group(3).startswith('<') else None
            if not m.group(1):
                groups.append(alt)
                alt = []
        elif last_virtual is not None and not line.startswith(('|', 'Recommends', 'Suggests')):
            providers.setdefault(last_virtual, []).append(line)
    seen, todo = set(), [p for p in roots]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        for group in graph.get(p, []):
            for choice in group:
                if choice.startswith('<'):
                    prov = providers.get(choice, [])
                    if prov:
                        todo.append(prov[0])
                        break
                else:
                    todo.append(choice)
                    break
    return seen


def base_image():
    """A plain debian:12 (Essential and Priority: required packages, and apt) plus build-essential."""
    r = subprocess.run(['apt-cache', 'dumpavail'], capture_output=True, text=True)
    roots, name = {'apt', 'build-essential'}, None
    for line in r.stdout.splitlines():
        if line.startswith('Package: '):
            name = line.split(': ', 1)[1].strip()
        elif line in ('Priority: required', 'Essential: yes') and name:
            roots.add(name)
    return closure(roots)


def deps_packages(script):
    r = subprocess.run(['bash', script, '--list'], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f'`bash {script} --list` failed: {r.stderr.strip()}')
    return set(r.stdout.split())


def main():
    if len(sys.argv) not in (2, 3):
        fail('usage: check_install_steps.py BUILD_DIR [DEPS_SCRIPT]')
    build = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    deps = sys.argv[2] if len(sys.argv) == 3 else os.path.join(here, 'deps.sh')
    if subprocess.run(['which', 'dpkg'], capture_output=True).returncode != 0:
        fail('dpkg is not on PATH: this check needs a Debian machine')
    paths = cache_paths(build)
    listed = deps_packages(deps)
    allowed = base_image() | closure(listed)
    bad = {}
    for path, entry in sorted(paths.items()):
        pkgs = owners_of(path)
        if not pkgs:
            bad.setdefault('(no package)', []).append(f'{entry}={path}')
        elif not pkgs & allowed:
            for p in sorted(pkgs):
                bad.setdefault(p, []).append(f'{entry}={path}')
    if bad:
        for pkg, where in sorted(bad.items()):
            print(f'package {pkg} is used by the build but not installed by {deps} '
                  f'(nor a Depends of what it installs, nor in the base image): {where[0]}'
                  + (f' and {len(where) - 1} more' if len(where) > 1 else ''))
        sys.exit(1)
    print(f'check_install_steps: {len(paths)} paths from {build}/CMakeCache.txt, all from packages '
          f'that {os.path.basename(deps)} installs ({len(listed)} listed) or the base image has')


if __name__ == '__main__':
    main()

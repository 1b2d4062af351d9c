#!/usr/bin/env python3
"""The Debian package (debian/, docs/packaging.md): builds it with dpkg-buildpackage from a copy
of the source, checks its layout, extracts it with dpkg-deb -x (no root) and runs the INSTALLED
mpsshimd, mpsshimctl, mpsshim-server and libmpsshim.so on the host-memory test driver with e2e
clients of the build tree.

usage: package_test.py SOURCE_DIR WORK_DIR VERSION
  (E2E_CLIENT and MPSSHIM_TESTDRIVER from the environment, as for the e2e suite; MPSSHIM_DEB=PATH
  tests that .deb instead of building one.) Exit 77 only when dpkg-deb, dpkg-buildpackage or
  debhelper is not installed."""
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from mpsshimd_run import Daemon, client_env, fail

SKIP = 77


def copy_source(source: str, dest: str) -> None:
    """The source tree without build directories, VCS data or an earlier package build's
    leftovers: what dpkg-buildpackage would see in a fresh checkout."""
    def ignore(directory: str, names: list[str]) -> set[str]:
        left_out = set()
        for name in names:
            path = os.path.join(directory, name)
            if name in (".git", "__pycache__", ".whl", ".gl", ".carry") or name.startswith("obj-"):
                left_out.add(name)
            elif os.path.isdir(os.path.join(path, "meson-private")):
                left_out.add(name)  # a meson build directory
            elif os.path.samefile(directory, os.path.join(source, "debian")) and name in (
                    ".debhelper", "mpsshim", "files", "debhelper-build-stamp"):
                left_out.add(name)
        return left_out
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, symlinks=True, ignore=ignore)


def build_deb(source: str, work: str, version: str) -> str:
    for tool, package in (("dpkg-buildpackage", "dpkg-dev"), ("dh", "debhelper")):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} is not installed (apt-get install {package})")
            sys.exit(SKIP)
    # A fixed path under the build directory, so that ccache serves a second run.
    src = os.path.join(work, "src")
    for old in os.listdir(work) if os.path.isdir(work) else []:
        if old.endswith((".deb", ".ddeb", ".buildinfo", ".changes")):
            os.unlink(os.path.join(work, old))
    os.makedirs(work, exist_ok=True)
    copy_source(source, src)
    log_path = os.path.join(work, "dpkg-buildpackage.log")
    started = time.monotonic()
    # Without optimization or debug information unless the caller sets DEB_BUILD_OPTIONS or
    # DEB_CXXFLAGS_STRIP: what this tests is the package (its making, layout and programs), and
    # the plain build's suites test the product at -O2. On a 2-core machine the optimized build
    # took 871 s of CPU (463 s), this one 594 s (315 s) (docs/packaging.md, "Tests").
    env = dict(os.environ)
    env.setdefault("DEB_BUILD_OPTIONS", "noopt")
    env.setdefault("DEB_CXXFLAGS_STRIP", "-g")
    with open(log_path, "wb") as log:
        r = subprocess.run(["dpkg-buildpackage", "-b", "-us", "-uc"], cwd=src, stdout=log,
                           stderr=subprocess.STDOUT, env=env)
    with open(log_path, errors="replace") as f:
        tail = f.read()[-6000:]
    if r.returncode != 0:
        fail(f"dpkg-buildpackage -b -us -uc exited {r.returncode} ({log_path}):\n{tail}")
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"dpkg-buildpackage (DEB_BUILD_OPTIONS={env['DEB_BUILD_OPTIONS']!r}, "
          f"DEB_CXXFLAGS_STRIP={env['DEB_CXXFLAGS_STRIP']!r}): {time.monotonic() - started:.0f} s, "
          f"{cpu.ru_utime + cpu.ru_stime:.0f} s of CPU")
    debs = [d for d in os.listdir(work) if d.startswith(f"mpsshim_{version}_") and
            d.endswith(".deb")]
    if len(debs) != 1:
        fail(f"expected one mpsshim_{version}_*.deb in {work}, found {sorted(os.listdir(work))}")
    return os.path.join(work, debs[0])


def dpkg_deb(*args: str) -> str:
    r = subprocess.run(["dpkg-deb", *args], capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"dpkg-deb {' '.join(args)} exited {r.returncode}: {r.stderr}")
    return r.stdout


def check_layout(deb: str, root: str, control: str, version: str) -> None:
    if dpkg_deb("-f", deb, "Package").strip() != "mpsshim":
        fail("the package is not called mpsshim")
    if dpkg_deb("-f", deb, "Version").strip() != version:
        fail(f"package version {dpkg_deb('-f', deb, 'Version').strip()} != meson's {version}"
             " (debian/changelog)")
    depends = dpkg_deb("-f", deb, "Depends")
    if "libcuda" in depends or "libfmt" not in depends:
        fail(f"Depends: {depends}")
    if os.path.exists(os.path.join(control, "shlibs")):
        fail("the package declares shlibs: other packages could resolve libcuda.so.1 to it")
    for path in ("usr/bin/mpsshimd", "usr/bin/mpsshimctl", "usr/bin/mpsshim-device-plugin",
                 "usr/libexec/mpsshim/mpsshim-server"):
        if not os.access(os.path.join(root, path), os.X_OK):
            fail(f"/{path} is missing or not executable")
    shim_dir = os.path.join(root, "usr/lib/mpsshim")
    if not os.path.isfile(os.path.join(shim_dir, "libmpsshim.so")):
        fail("/usr/lib/mpsshim/libmpsshim.so is missing")
    if os.readlink(os.path.join(shim_dir, "libcuda.so.1")) != "libmpsshim.so":
        fail("/usr/lib/mpsshim/libcuda.so.1 is not a link to libmpsshim.so")
    for directory, _, files in os.walk(root):
        for name in files:
            relative = os.path.relpath(os.path.join(directory, name), root)
            if name.startswith("libcuda") and not relative.startswith("usr/lib/mpsshim/"):
                fail(f"/{relative} would shadow the real driver")
            if name in ("e2e_client", "libmpsshim-testdriver.so", "vector_add") or \
                    name.endswith("_test"):
                fail(f"/{relative}: a test or example program in the package")
    with open(os.path.join(root, "lib/systemd/system/mpsshimd.service")) as f:
        unit = f.read()
    for line in ("ExecStart=/usr/bin/mpsshimd ", "Documentation=file:/usr/share/doc/mpsshim/daemon.md",
                 "LD_PRELOAD=/usr/lib/mpsshim/libmpsshim.so"):
        if line not in unit:
            fail(f"mpsshimd.service lacks `{line}`:\n{unit}")
    for path in ("usr/share/doc/mpsshim/daemon.md", "usr/share/doc/mpsshim/packaging.md",
                 "usr/share/doc/mpsshim/README.md", "usr/share/doc/mpsshim/copyright",
                 "usr/share/mpsshim/grafana/mpsshim.json"):
        if not os.path.isfile(os.path.join(root, path)):
            fail(f"/{path} is missing")


def run_client(args: list[str], env: dict, what: str) -> str:
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        fail(f"{what}: {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr[-4000:]}")
    return r.stdout + r.stderr


def main() -> int:
    source, work, version = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2]), sys.argv[3]
    if shutil.which("dpkg-deb") is None:
        print("SKIP: dpkg-deb is not installed")
        return SKIP
    deb = os.environ.get("MPSSHIM_DEB") or build_deb(source, work, version)
    print(f"package: {deb}")
    with tempfile.TemporaryDirectory(prefix="mpsshim-deb-") as tmp:
        root, control, runtime = (os.path.join(tmp, d) for d in ("root", "control", "run"))
        dpkg_deb("-x", deb, root)
        dpkg_deb("-e", deb, control)
        os.mkdir(runtime, 0o700)
        check_layout(deb, root, control, version)

        installed_server = os.path.realpath(os.path.join(root, "usr/libexec/mpsshim/mpsshim-server"))
        shim_dir = os.path.join(root, "usr/lib/mpsshim")
        # No --server: the installed mpsshimd must find the installed server by itself.
        daemon = Daemon(os.path.join(root, "usr/bin/mpsshimd"),
                        os.path.join(root, "usr/bin/mpsshimctl"), runtime,
                        os.environ["MPSSHIM_TESTDRIVER"], [])
        try:
            servers = daemon.ctl_json("server_list")["servers"]
            if not servers or servers[0]["state"] != "running" or not servers[0]["pid"]:
                fail(f"server_list: {servers}")
            exe = os.path.realpath(f"/proc/{servers[0]['pid']}/exe")
            if exe != installed_server:
                fail(f"GPU 0's server is {exe}, not the installed {installed_server}")

            out = run_client([os.environ["E2E_CLIENT"], "basic", "16"],
                             client_env(runtime, LD_PRELOAD=os.path.join(shim_dir, "libmpsshim.so")),
                             "LD_PRELOAD client")
            if "PASS basic n=16" not in out:
                fail(f"the LD_PRELOAD client did not say PASS:\n{out}")
            # The libcuda.so.1 link: the loader finds the shim by LD_LIBRARY_PATH alone.
            out = run_client([os.environ["E2E_CLIENT"], "basic", "16"],
                             client_env(runtime, LD_LIBRARY_PATH=shim_dir, LD_DEBUG="libs"),
                             "LD_LIBRARY_PATH client")
            if f"calling init: {shim_dir}/libcuda.so.1" not in out:
                fail(f"the LD_LIBRARY_PATH client did not load {shim_dir}/libcuda.so.1:\n"
                     f"{out[-4000:]}")
            if "PASS basic n=16" not in out:
                fail(f"the LD_LIBRARY_PATH client did not say PASS:\n{out[-4000:]}")
            daemon.quit()
        finally:
            daemon.kill()
    print(f"PASS installed package {os.path.basename(deb)}: {installed_server[len(root):]} served"
          " both clients")
    return 0


if __name__ == "__main__":
    sys.exit(main())

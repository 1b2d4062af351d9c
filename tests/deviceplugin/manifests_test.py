#!/usr/bin/env python3
"""packaging/kubernetes/ parses and says what docs/kubernetes.md says it does.

Checks the key fields of every manifest (YAML via python3-yaml), that the kustomization lists
files that exist, and that the ConfigMap's sharing.toml is one the device plugin accepts (its own
parser, through --check-config). Exit 77 (skipped) without python3-yaml.
"""
import os
import subprocess
import sys
import tempfile

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed")
    sys.exit(77)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
DIR = os.path.join(ROOT, "packaging", "kubernetes")
failures = []


def check(condition, what):
    if not condition:
        failures.append(what)


def load(name):
    with open(os.path.join(DIR, name)) as f:
        return list(yaml.safe_load_all(f))


kustomization = load("kustomization.yaml")[0]
check(kustomization.get("kind") == "Kustomization", "kustomization.yaml: kind Kustomization")
check(kustomization.get("namespace") == "mpsshim-system", "kustomization.yaml: namespace")
objects = {}
for resource in kustomization.get("resources", []):
    check(os.path.isfile(os.path.join(DIR, resource)), f"kustomization lists missing {resource}")
    for doc in load(resource):
        check("apiVersion" in doc and "kind" in doc and "name" in doc.get("metadata", {}),
              f"{resource}: apiVersion, kind and metadata.name")
        objects[doc["kind"]] = doc

daemonset = objects.get("DaemonSet")
check(daemonset is not None, "a DaemonSet")
if daemonset:
    pod = daemonset["spec"]["template"]["spec"]
    check(daemonset["spec"]["selector"]["matchLabels"].items()
          <= daemonset["spec"]["template"]["metadata"]["labels"].items(),
          "DaemonSet: the selector matches the pod template's labels")
    check(pod.get("nodeSelector", {}).get("nvidia.com/gpu.present") == "true",
          "DaemonSet: runs on nodes labelled nvidia.com/gpu.present=true")
    check(not pod.get("hostIPC") and not pod.get("hostPID"), "DaemonSet: no hostIPC, no hostPID")
    containers = {c["name"]: c for c in pod["containers"]}
    check(set(containers) == {"mpsshimd", "device-plugin"}, "DaemonSet: mpsshimd and device-plugin")
    volumes = {v["name"]: v for v in pod["volumes"]}
    check(volumes.get("device-plugins", {}).get("hostPath", {}).get("path")
          == "/var/lib/kubelet/device-plugins", "DaemonSet: the kubelet's device-plugin dir")
    check(volumes.get("runtime-dir", {}).get("hostPath", {}).get("path") == "/run/mpsshim",
          "DaemonSet: /run/mpsshim from the node")
    daemon = containers.get("mpsshimd", {})
    args = daemon.get("args", [])
    for flag in ["--multiuser", "--require-allocation-token", "--runtime-dir=/run/mpsshim"]:
        check(flag in args, f"mpsshimd: {flag}")
    check(any(a.startswith("--metrics-listen=") for a in args), "mpsshimd: --metrics-listen")
    plugin = containers.get("device-plugin", {})
    mounts = {m["mountPath"] for m in plugin.get("volumeMounts", [])}
    check({"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/run/mpsshim",
           "/etc/mpsshim"} <= mounts,
          "device-plugin: mounts the kubelet's dirs, the runtime dir and the config")
    check(plugin.get("args", [])[-1:] == ["/etc/mpsshim/sharing.toml"],
          "device-plugin: --config /etc/mpsshim/sharing.toml")

configmap = objects.get("ConfigMap")
check(configmap is not None and "sharing.toml" in configmap.get("data", {}),
      "a ConfigMap with sharing.toml")
plugin_binary = os.environ.get("MPSSHIM_DEVICE_PLUGIN")
if configmap and plugin_binary:
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as toml_file:
        toml_file.write(configmap["data"]["sharing.toml"])
        toml_file.flush()
        run = subprocess.run([plugin_binary, "--config", toml_file.name, "--check-config"],
                             capture_output=True, text=True)
        check(run.returncode == 0, f"the plugin rejects sharing.toml: {run.stderr.strip()}")
        check("7 replicas" in run.stdout, "sharing.toml: the H100 table (7 replicas)")

example = load("example-pod.yaml")[0]
limits = example["spec"]["containers"][0]["resources"]["limits"]
check(limits.get("mpsshim.io/gpu") == 1, "example pod: limits mpsshim.io/gpu: 1")
check(not example["spec"].get("hostIPC"), "example pod: no hostIPC")

with open(os.path.join(DIR, "Containerfile")) as f:
    containerfile = f.read()
for package in ["libgrpc++-dev", "protobuf-compiler-grpc", "libtomlplusplus-dev"]:
    check(package in containerfile, f"Containerfile installs {package}")

for failure in failures:
    print("FAIL:", failure)
if failures:
    sys.exit(1)
print(f"PASS: {len(objects)} kinds of objects checked")

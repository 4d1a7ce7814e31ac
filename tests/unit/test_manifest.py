"""cluster.yaml models and loader: every rule, with the exact field path, line and message.

Invalid cases mark the line the error must point at with a trailing ``# !`` comment, so each
case states its expected line next to the text it comes from.
"""

from __future__ import annotations

import os
import re
import textwrap
import threading
from pathlib import Path

import pydantic
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import ManifestError
from orchestrator.manifest.load import load_manifest, load_manifest_file
from orchestrator.manifest.model import Manifest
from orchestrator.manifest.sections import parse_size

REPO = Path(__file__).resolve().parents[2]

TWO_GPU_NODES = """\
name: llama
nodes:
  - name: a
    host: 10.0.0.1
    role: head
    gpus: 8
  - name: b
    host: 10.0.0.2
    gpus: 8
"""


def load(text: str, path: str | Path = "cluster.yaml") -> Manifest:
    return load_manifest(textwrap.dedent(text), Path(path))


def problems_of(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load(text)
    assert info.value.exit_code == 2
    return info.value.problems


def marked_line(text: str) -> int:
    marked = [n for n, line in enumerate(textwrap.dedent(text).splitlines(), 1) if line.rstrip().endswith("# !")]
    assert len(marked) == 1, "each case marks exactly one line with '# !'"
    return marked[0]


# (id, manifest text, field path, message fragment); the expected line carries '# !'.
INVALID = [
    ("typo-top-key", """\
        name: x
        nodse:  # !
          - {name: a, host: h, role: head, gpus: 1}
        """, "nodse", "unknown key 'nodse' (did you mean 'nodes'?)"),
    ("typo-node-key", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpu: 8  # !
        """, "nodes[0].gpu", "unknown key 'gpu' (did you mean 'gpus'?)"),
    ("typo-ray-key", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          dashbord_port: 8265  # !
        """, "ray.dashbord_port", "did you mean 'dashboard_port'?"),
    ("typo-ssh-key", """\
        name: x
        ssh:
          identity: ~/.ssh/id  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "ssh.identity", "did you mean 'identity_file'?"),
    ("typo-serve-key", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        serve:
          port: 8000  # !
        """, "serve.port", "did you mean 'http_port'?"),
    ("unknown-key-no-match", """\
        name: x
        colour: blue  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "colour", "unknown key 'colour'; valid keys: name, accelerator"),
    ("missing-name", """\
        # a comment first
        nodes: [{name: a, host: h, role: head, gpus: 1}]  # !
        """, "name", "required key missing"),
    ("missing-nodes", """\
        name: x  # !
        """, "nodes", "required key missing"),
    ("empty-nodes", """\
        name: x
        nodes: []  # !
        """, "nodes", "must list at least one node"),
    ("nodes-is-mapping", """\
        name: x
        nodes:  # !
          a: {host: h}
        """, "nodes", "must be a list"),
    ("node-is-scalar", """\
        name: x
        nodes:
          - {name: a, host: h, role: head, gpus: 1}
          - 5  # !
        """, "nodes[1]", "must be a mapping of keys (got 5)"),
    ("node-missing-host", """\
        name: x
        nodes:
          - name: a  # !
            role: head
            gpus: 1
        """, "nodes[0].host", "required key missing"),
    ("no-head", """\
        name: x
        nodes:  # !
          - {name: a, host: h1, gpus: 1}
          - {name: b, host: h2, gpus: 1}
        """, "nodes", "no node has 'role: head'"),
    ("two-heads", """\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - name: b
            host: h2
            role: head  # !
            gpus: 1
        """, "nodes[1].role", "a second head; nodes[0] is already the head"),
    ("duplicate-node-name", """\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - name: a  # !
            host: h2
            gpus: 1
        """, "nodes[1].name", "duplicate node name 'a' (also nodes[0])"),
    ("duplicate-host-port", """\
        name: x
        ssh: {port: 2222}
        nodes:
          - {name: a, host: 10.0.0.1, port: 2222, role: head, gpus: 1}
          - name: b
            host: 10.0.0.1  # !
            gpus: 1
        """, "nodes[1].host", "'10.0.0.1' port 2222 is already nodes[0]"),
    ("gpus-zero-on-gpu", """\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 8}
          - name: b
            host: h2
            gpus: 0  # !
        """, "nodes[1].gpus", "must be at least 1 on a gpu cluster (got 0)"),
    ("gpus-missing-on-gpu", """\
        name: x
        nodes:
          - name: a  # !
            host: h1
            role: head
        """, "nodes[0].gpus", "required on a gpu cluster"),
    ("gpus-negative", """\
        name: x
        accelerator: cpu
        nodes:
          - name: a
            host: h1
            role: head
            gpus: -1  # !
        """, "nodes[0].gpus", "must be 0 on a cpu cluster (got -1)"),
    ("gpus-string", """\
        name: x
        nodes:
          - name: a
            host: h1
            role: head
            gpus: "8"  # !
        """, "nodes[0].gpus", "must be a whole number (got '8')"),
    ("gpus-on-cpu-cluster", """\
        name: x
        accelerator: cpu
        nodes:
          - name: a
            host: h1
            role: head
            gpus: 2  # !
        """, "nodes[0].gpus", "must be 0 on a cpu cluster (got 2)"),
    ("role-typo", """\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - name: b
            host: h2
            role: wroker  # !
            gpus: 1
        """, "nodes[1].role", "must be 'head' or 'worker' (got 'wroker'); did you mean 'worker'?"),
    ("accelerator-unknown", """\
        name: x
        accelerator: tpu  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "accelerator", "must be 'gpu' or 'cpu' (got 'tpu')"),
    ("transport-unknown", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            transport: docker  # !
        """, "nodes[0].transport", "must be 'ssh' or 'local' (got 'docker')"),
    ("ssh-port-too-big", """\
        name: x
        ssh:
          port: 70000  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "ssh.port", "must be at most 65535 (got 70000)"),
    ("node-port-zero", """\
        name: x
        nodes:
          - name: a
            host: h
            port: 0  # !
            role: head
            gpus: 1
        """, "nodes[0].port", "must be at least 1 (got 0)"),
    ("http-port-equals-ray-port", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray: {port: 8000}
        serve:
          http_port: 8000  # !
        """, "serve.http_port", "port 8000 is also used by ray.port (Ray GCS) on the head node"),
    ("dashboard-equals-ray-port", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          port: 6379
          dashboard_port: 6379  # !
        """, "ray.dashboard_port", "port 6379 is also used by ray.port"),
    ("ray-port-is-client-server", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          port: 10001  # !
        """, "ray.port", "also used by the Ray client server"),
    ("ray-port-in-worker-range", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          port: 12000  # !
        """, "ray.port", "inside Ray's worker port range 10002-19999"),
    ("http-port-is-dashboard-agent", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        serve:
          http_port: 52365  # !
        """, "serve.http_port", "also used by the Ray dashboard agent"),
    ("sshd-port-is-ray-port", """\
        name: x
        nodes:
          - {name: a, host: h, port: 6379, role: head, gpus: 1}
        ray:
          port: 6379  # !
        """, "ray.port", "port 6379 is also used by sshd on node 'a'"),
    ("interface-too-long", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            interface: enp129s0f0np0xyz  # !
        """, "nodes[0].interface", "is 16 bytes; Linux interface names have at most 15"),
    ("interface-slash", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            interface: ib/0  # !
        """, "nodes[0].interface", "'ib/0' is not a valid interface name"),
    ("interface-alias-colon", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            interface: "eth0:1"  # !
        """, "nodes[0].interface", "'eth0:1' is not a valid interface name"),
    ("interface-list", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            interface: ib0,ib1  # !
        """, "nodes[0].interface", "names several interfaces"),
    ("two-local-nodes", """\
        name: x
        accelerator: cpu
        nodes:
          - {name: a, host: 127.0.0.1, role: head, transport: local}
          - name: b
            host: 127.0.0.2
            transport: local  # !
        """, "nodes[1].transport", "only one node can be the machine orch runs on"),
    ("env-bad-name", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        env:
          1FOO: bar  # !
        """, "env['1FOO']", "'1FOO' is not a valid environment variable name"),
    ("node-env-bool-value", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            env:
              VLLM_USE_V1: yes  # !
        """, "nodes[0].env.VLLM_USE_V1", "must be a string; quote it (\"true\")"),
    ("object-store-bad-unit", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          object_store_memory: 8G  # !
        """, "ray.object_store_memory", "unknown unit 'G' in '8G'"),
    ("object-store-too-small", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          object_store_memory: 10MB  # !
        """, "ray.object_store_memory", "below Ray's minimum object store of 75 MiB"),
    ("object-store-not-a-size", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          object_store_memory: lots  # !
        """, "ray.object_store_memory", "'lots' is not a size"),
    ("temp-dir-too-long", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          temp_dir: /scratch/a/rather/deep/folder/for/ray/sessions  # !
        """, "ray.temp_dir", "107-byte AF_UNIX limit"),
    ("token-auth-string", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          token_auth: "yes"  # !
        """, "ray.token_auth", "must be true or false (got 'yes')"),
    ("connect-timeout-zero", """\
        name: x
        ssh:
          connect_timeout: 0  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "ssh.connect_timeout", "must be greater than 0 (got 0)"),
    ("error-rate-above-one", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        targets:
          max_error_rate: 1.5  # !
        """, "targets.max_error_rate", "must be at most 1 (got 1.5)"),
    ("ttft-negative", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        targets:
          ttft_p95_ms: -5  # !
        """, "targets.ttft_p95_ms", "must be greater than 0 (got -5)"),
    ("host-with-user", """\
        name: x
        nodes:
          - name: a
            host: root@10.0.0.1  # !
            role: head
            gpus: 1
        """, "nodes[0].host", "put the user in 'user'"),
    ("host-with-port", """\
        name: x
        nodes:
          - name: a
            host: 10.0.0.1:2222  # !
            role: head
            gpus: 1
        """, "nodes[0].host", "put the SSH port in 'port'"),
    ("host-invalid", """\
        name: x
        nodes:
          - name: a
            host: gpu_box!  # !
            role: head
            gpus: 1
        """, "nodes[0].host", "'gpu_box!' is not a valid host name or IP address"),
    ("cluster-name-with-space", """\
        name: my cluster  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "name", "'my cluster' is not a valid name"),
    ("node-name-number", """\
        name: x
        nodes:
          - name: 7  # !
            host: h
            role: head
            gpus: 1
        """, "nodes[0].name", "must be a string (got 7); quote it"),
    ("duplicate-yaml-key", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            gpus: 2  # !
        """, "nodes[0].gpus", "duplicate key 'gpus' (first given at line 6)"),
    ("python-with-arguments", """\
        name: x
        python: uv run python  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "python", "must be one interpreter"),
    ("identity-file-empty", """\
        name: x
        ssh:
          identity_file: ""  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "ssh.identity_file", "must not be empty"),
    ("source-path-in-file", """\
        name: x
        source_path: /etc/passwd  # !
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        """, "source_path", "set by orch when it reads the file"),
    ("cpus-zero", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            cpus: 0  # !
        """, "nodes[0].cpus", "must be at least 1 (got 0)"),
    ("api-key-env-invalid", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        serve:
          api_key_env: my-key  # !
        """, "serve.api_key_env", "'my-key' is not a valid environment variable name"),
    ("ray-section-is-list", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:  # !
          - port: 6379
        """, "ray", "must be a mapping of keys (got a list)"),
    ("http-port-in-worker-range", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        serve:
          http_port: 15000  # !
        """, "serve.http_port", "inside Ray's worker port range"),
    ("gpu-type-empty", """\
        name: x
        nodes:
          - name: a
            host: h
            role: head
            gpus: 1
            gpu_type: ""  # !
        """, "nodes[0].gpu_type", "must not be empty"),
    ("unknown-yaml-tag", """\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        env:
          A: !!python/object:os.system x  # !
        """, "env.A", "could not determine a constructor for the tag"),
]


@pytest.mark.parametrize("text,path,fragment", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_manifest_names_line_path_and_problem(text, path, fragment):
    problems = problems_of(text)
    prefix = f"cluster.yaml:{marked_line(text)}: {path}: "
    matching = [p for p in problems if p.startswith(prefix)]
    assert matching, f"no problem starts with {prefix!r}: {problems}"
    assert any(fragment in p for p in matching), f"{fragment!r} not in {matching}"


def test_a_typo_in_targets_is_an_error():
    # A misspelt target would silently drop it from `orch accept` (issue 17's planted bug).
    problems = problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        targets:
          ttft_p95: 500
        """)
    assert problems == ["cluster.yaml:4: targets.ttft_p95: unknown key 'ttft_p95' (did you mean 'ttft_p95_ms'?)"]


def test_there_are_at_least_thirty_invalid_cases():
    assert len({c[0] for c in INVALID}) == len(INVALID) >= 30


@pytest.mark.parametrize(
    "text,line,fragment",
    [
        ("", 1, "the file is empty"),
        ("# only a comment\n\n", 1, "the file is empty"),
        ("# x\n- name: a\n- name: b\n", 2, "the top level must be a mapping ('name: ...', 'nodes: ...'), got a list"),
        ("just words\n", 1, "the top level must be a mapping"),
        ("name: x\nnodes: [\n", 3, "invalid YAML"),
        ("name: x\nnodes:\n\t- a\n", 3, "YAML indents with spaces, not tabs"),
        ("name: x\nray: {port: 1\n", 3, "invalid YAML"),
        ("name: a: b\n", 1, "mapping values are not allowed here"),
        ("name: x\n---\nname: y\n", 2, "expected a single document"),
        ("name: x\nnodes: *nowhere\n", 2, "found undefined alias 'nowhere'"),
        ("name: x\x00\n", 1, "unacceptable character #x0000"),
    ],
    ids=["empty", "comments-only", "list-top", "scalar-top", "unclosed-flow", "tab", "unclosed-map",
         "nested-colon", "two-documents", "undefined-alias", "nul-char"],
)
def test_text_that_is_not_a_manifest_mapping(text, line, fragment):
    problems = problems_of(text)
    assert len(problems) == 1
    assert problems[0].startswith(f"cluster.yaml:{line}: ")
    assert fragment in problems[0]


def test_every_problem_is_reported_at_once_sorted_by_line():
    text = """\
        name: x
        acelerator: gpu
        nodes:
          - {name: a, host: h1, role: head, gpus: 0}
          - {name: a, host: h2, role: head, gpus: 1, gpu: 1}
        ray: {port: 8000}
        """
    with pytest.raises(ManifestError) as info:
        load(text)
    problems = info.value.problems
    assert problems == [
        "cluster.yaml:2: acelerator: unknown key 'acelerator' (did you mean 'accelerator'?)",
        "cluster.yaml:4: nodes[0].gpus: must be at least 1 on a gpu cluster (got 0)",
        "cluster.yaml:5: nodes[1].gpu: unknown key 'gpu' (did you mean 'gpus'?)",
        "cluster.yaml:5: nodes[1].name: duplicate node name 'a' (also nodes[0])",
        "cluster.yaml:5: nodes[1].role: a second head; nodes[0] is already the head and a cluster has exactly one",
        "cluster.yaml:6: ray.port: port 8000 is also used by serve.http_port (Ray Serve HTTP proxy, every node) on the head node",
    ]
    assert info.value.message == "cluster.yaml: 6 problems"
    assert "cluster-templates/" in info.value.hint and "orch validate" in info.value.hint


def test_a_single_problem_is_the_message():
    with pytest.raises(ManifestError) as info:
        load("name: x\nnodes: [{name: a, host: h, role: head, gpus: 1, gpu: 1}]\n")
    assert info.value.message == info.value.problems[0]
    assert info.value.message.startswith("cluster.yaml:2: nodes[0].gpu: unknown key 'gpu'")


# ---- valid manifests ----


def test_defaults_of_a_minimal_manifest():
    m = load(TWO_GPU_NODES)
    assert (m.name, m.accelerator, m.python) == ("llama", "gpu", "python3")
    assert (m.ssh.user, m.ssh.port, m.ssh.identity_file, m.ssh.known_hosts, m.ssh.connect_timeout) == ("root", 22, None, None, 10.0)
    assert (m.ray.port, m.ray.dashboard_port, m.ray.temp_dir, m.ray.object_store_memory) == (6379, 8265, "/tmp/ray", None)
    assert m.ray.token_auth is True and m.ray.num_cpus is None
    assert (m.serve.http_port, m.serve.api_key_env) == (8000, "ORCH_API_KEY")
    assert m.model_store is None and m.targets is None and m.env == {}
    assert m.head.name == "a" and [w.name for w in m.workers] == ["b"]
    b = m.node("b")
    assert (b.role, b.transport, b.port, b.user, b.interface, b.cpus) == ("worker", "ssh", None, None, None, None)
    assert m.total_gpus == 16


def test_node_helpers_fall_back_to_cluster_defaults():
    m = load("""\
        name: x
        python: /opt/venv/bin/python
        ssh: {user: ubuntu, port: 2200}
        ray: {num_cpus: 16}
        env: {A: "1", B: "2"}
        nodes:
          - {name: a, host: h1, role: head, gpus: 1, port: 22, user: admin, python: python3.11, cpus: 4, env: {B: "3"}}
          - {name: b, host: h2, gpus: 1}
        """)
    a, b = m.nodes
    assert (a.ssh_port(m), a.ssh_user(m), a.python_bin(m), a.ray_cpus(m)) == (22, "admin", "python3.11", 4)
    assert (b.ssh_port(m), b.ssh_user(m), b.python_bin(m), b.ray_cpus(m)) == (2200, "ubuntu", "/opt/venv/bin/python", 16)
    assert a.merged_env(m) == {"A": "1", "B": "3"} and b.merged_env(m) == {"A": "1", "B": "2"}


def test_relative_paths_resolve_against_the_manifest_folder(monkeypatch):
    monkeypatch.setenv("HOME", "/home/op")
    m = load("""\
        name: x
        python: ../venv/bin/python
        ssh:
          identity_file: keys/id_ed25519
          known_hosts: ~/known_hosts
        model_store: ./models/../weights
        ray: {temp_dir: ray}
        nodes:
          - {name: a, host: h, role: head, gpus: 1, python: python3}
          - {name: b, host: h2, gpus: 1, python: ~/py/bin/python}
        """, path="/srv/clusters/prod.yaml")
    assert m.ssh.identity_file == Path("/srv/clusters/keys/id_ed25519")
    assert m.ssh.known_hosts == Path("/home/op/known_hosts")
    assert m.model_store == Path("/srv/clusters/weights")
    assert m.ray.temp_dir == "/srv/clusters/ray"
    assert m.python == "/srv/venv/bin/python"
    assert m.nodes[0].python == "python3"  # a bare name is looked up on the node's PATH
    assert m.nodes[1].python == "/home/op/py/bin/python"
    assert m.source_path == Path("/srv/clusters/prod.yaml")


def test_absolute_paths_are_kept():
    m = load("name: x\nmodel_store: /mnt/models\nssh: {identity_file: /k/id}\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n", path="/elsewhere/c.yaml")
    assert m.model_store == Path("/mnt/models") and m.ssh.identity_file == Path("/k/id")


@pytest.mark.parametrize(
    "value,expected",
    [("8GiB", 8 * 2**30), ("500MB", 500_000_000), ("1.5 GiB", 3 * 2**29), ("100MiB", 100 * 2**20),
     ("2TB", 2 * 10**12), ("104857600", 104857600), (104857600, 104857600), ("80mib", 80 * 2**20)],
)
def test_object_store_sizes(value, expected):
    quoted = f'"{value}"' if isinstance(value, str) else value
    m = load(f"name: x\nnodes: [{{name: a, host: h, role: head, gpus: 1}}]\nray: {{object_store_memory: {quoted}}}\n")
    assert m.ray.object_store_memory == expected
    assert parse_size(value) == expected


def test_env_numbers_become_strings():
    m = load("name: x\nnodes: [{name: a, host: h, role: head, gpus: 1}]\nenv: {NCCL_IB_DISABLE: 0, RATIO: 0.5, S: text}\n")
    assert m.env == {"NCCL_IB_DISABLE": "0", "RATIO": "0.5", "S": "text"}


def test_empty_sections_mean_defaults():
    m = load("name: x\nssh:\nray:\nserve:\nenv:\nnodes: [{name: a, host: h, role: head, gpus: 1, env: }]\n")
    assert m.ray.port == 6379 and m.ssh.user == "root" and m.serve.http_port == 8000 and m.env == {}


def test_cpu_cluster_defaults_to_zero_gpus_and_same_host_other_port_is_fine():
    m = load("""\
        name: x
        accelerator: cpu
        nodes:
          - {name: a, host: 127.0.0.1, role: head, transport: local, cpus: 8}
          - {name: b, host: 10.0.0.5, port: 2201}
          - {name: c, host: 10.0.0.5, port: 2202}
        """)
    assert [n.gpus for n in m.nodes] == [0, 0, 0]
    assert m.summary() == "cluster 'x' - 3 nodes (1 head, 2 workers), CPU only, ray :6379"


def test_yaml_anchors_and_merge_keys_are_allowed():
    # an anchor on the first node, merged into the second, which overrides gpus
    m = load("""\
        name: x
        nodes:
          - &gpu {name: a, host: h1, role: head, gpus: 8, gpu_type: H100-80GB, interface: ib0}
          - {<<: *gpu, name: b, host: h2, role: worker, gpus: 4}
        """)
    assert (m.nodes[1].gpus, m.nodes[1].gpu_type, m.nodes[1].interface, m.nodes[1].role) == (4, "H100-80GB", "ib0", "worker")


def test_manifest_is_frozen():
    m = load(TWO_GPU_NODES)
    with pytest.raises(pydantic.ValidationError):
        m.name = "other"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        m.nodes[0].gpus = 1  # type: ignore[misc]


def test_summary_of_a_gpu_cluster():
    m = load(TWO_GPU_NODES.replace("gpus: 8\n  - name: b", "gpus: 8\n    gpu_type: H100-80GB\n  - name: b"))
    assert m.summary() == "cluster 'llama' - 2 nodes (1 head, 1 worker), 16 GPUs (H100-80GB), ray :6379"


# ---- fingerprint ----


def test_fingerprint_ignores_comments_layout_order_and_explicit_defaults():
    reordered = """\
        # production cluster
        nodes:
          - {host: 10.0.0.1, name: a, gpus: 8, role: head}   # the head

          - name: b
            gpus: 8
            host: 10.0.0.2
            role: worker
        ray:
          port: 6379        # the default, written out
        name: llama
        """
    first = load(TWO_GPU_NODES).fingerprint()
    assert load(reordered).fingerprint() == first
    assert re.fullmatch(r"[0-9a-f]{64}", first), first  # a sha256 hex digest


def test_fingerprint_changes_with_any_value():
    base = load(TWO_GPU_NODES).fingerprint()
    assert load(TWO_GPU_NODES.replace("gpus: 8\n", "gpus: 4\n", 1)).fingerprint() != base
    assert load(TWO_GPU_NODES + "env: {NCCL_DEBUG: INFO}\n").fingerprint() != base
    assert load(TWO_GPU_NODES.replace("10.0.0.2", "10.0.0.3")).fingerprint() != base
    assert load(TWO_GPU_NODES + "ssh: {identity_file: /keys/id}\n").fingerprint() != base  # a path: dumped as JSON text


def test_fingerprint_ignores_the_order_of_mapping_keys_the_model_keeps():
    # env is a mapping the model keeps in the file's order: the fingerprint must not see that order.
    one = load(TWO_GPU_NODES + "env: {A: '1', B: '2'}\n").fingerprint()
    assert load(TWO_GPU_NODES + "env: {B: '2', A: '1'}\n").fingerprint() == one


def test_fingerprint_does_not_depend_on_where_the_file_is():
    assert load(TWO_GPU_NODES, "/a/one.yaml").fingerprint() == load(TWO_GPU_NODES, "/b/two.yaml").fingerprint()


# ---- files ----


def test_load_manifest_file_reads_and_resolves(tmp_path):
    (tmp_path / "c.yaml").write_text("name: x\nssh: {identity_file: id}\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n")
    m = load_manifest_file(tmp_path / "c.yaml")
    assert m.ssh.identity_file == tmp_path / "id" and m.source_path == tmp_path / "c.yaml"


def test_utf8_bom_is_accepted(tmp_path):
    (tmp_path / "c.yaml").write_bytes(b"\xef\xbb\xbfname: x\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n")
    assert load_manifest_file(tmp_path / "c.yaml").name == "x"


@pytest.mark.parametrize(
    "make,fragment",
    [
        (lambda d: d / "missing.yaml", "missing.yaml: no such file"),
        (lambda d: d, ": is a directory, not a manifest file"),
        (lambda d: _write(d / "bin.yaml", b"name: x\n\x89PNG\r\n\x1a\n\xff\xfe"), "bin.yaml:2: not UTF-8 text (byte 0x89"),
        (lambda d: _write(d / "big.yaml", b"# " + b"x" * (1024 * 1024) + b"\n"), "big.yaml: larger than 1024 KiB"),
        (lambda d: _write(d / "latin1.yaml", "name: caf\u00e9\n".encode("latin-1")), "latin1.yaml:1: not UTF-8 text (byte 0xe9"),
    ],
    ids=["missing", "directory", "binary", "too-large", "latin1"],
)
def test_unreadable_files_raise_one_manifest_error(tmp_path, make, fragment):
    target = make(tmp_path)
    with pytest.raises(ManifestError) as info:
        load_manifest_file(target)
    assert len(info.value.problems) == 1 and fragment in info.value.problems[0]
    assert str(target) in info.value.problems[0]


def test_unreadable_permission(tmp_path, monkeypatch):
    import orchestrator.manifest.load as manifest_module

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    # root reads any file, so the refusal is simulated at the one open the loader makes
    monkeypatch.setattr(manifest_module, "_open_for_reading", denied)
    with pytest.raises(ManifestError) as info:
        load_manifest_file(_write(tmp_path / "c.yaml", b"name: x\n"))
    assert info.value.problems == [f"{tmp_path / 'c.yaml'}: permission denied"]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """`orch validate FIFO` hung forever waiting for a writer (issue 12)."""
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    outcome: list[BaseException] = []
    worker = threading.Thread(target=lambda: outcome.append(_raised(lambda: load_manifest_file(fifo))), daemon=True)
    worker.start()
    worker.join(60)  # one generous deadline: before the fix the open never returned
    if worker.is_alive():
        with open(fifo, "wb"):  # release the stuck reader, then fail
            pass
        pytest.fail("loading a FIFO waits for a writer")
    assert isinstance(outcome[0], ManifestError)
    assert outcome[0].problems == [f"{fifo}: is a FIFO (named pipe), not a regular file: give the manifest as a file"]


def test_a_device_is_refused():
    with pytest.raises(ManifestError) as info:
        load_manifest_file("/dev/zero")
    assert info.value.problems == ["/dev/zero: is a device or socket, not a regular file: give the manifest as a file"]


def _alias_bomb(levels: int) -> str:
    """Each anchor is a list of 9 aliases of the previous one: 9**levels values from ~60 bytes a level."""
    lines = ["name: x", "nodes: [{name: a, host: h, role: head, gpus: 1}]", "a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_after_a_bounded_number_of_values():
    """9**6 = 531,441 values from 437 bytes (issue 12's 364-byte file took 15 s and 1.2 GB; 9 levels
    never finished): refused once MAX_VALUES are built, at the line where it happened."""
    text = _alias_bomb(6)
    assert len(text) < 500
    with pytest.raises(ManifestError) as info:
        load_manifest(text, Path("/x/bomb.yaml"))
    assert len(info.value.problems) == 1
    assert "expands to more than 100,000 values" in info.value.problems[0]
    assert info.value.problems[0].startswith("/x/bomb.yaml:")


def test_aliases_within_the_budget_still_work():
    text = "name: x\nshared: &e {A: '1'}\nnodes:\n" + "".join(
        f"  - {{name: n{i}, host: 10.0.0.{i + 1}, gpus: 1, env: *e{', role: head' if i == 0 else ''}}}\n" for i in range(50)
    )
    with pytest.raises(ManifestError, match="unknown key 'shared'"):  # the anchor's holder is no manifest key
        load_manifest(text, Path("/x/c.yaml"))
    ok = text.replace("shared: &e {A: '1'}\n", "env: &e {A: '1'}\n")
    assert all(n.env == {"A": "1"} for n in load_manifest(ok, Path("/x/c.yaml")).nodes)


def _raised(fn) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:
        return exc
    return None


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", ["local.yaml", "1x8-h100.yaml", "2x8-h100-405b.yaml"])
def test_templates_are_valid(name):
    m = load_manifest_file(REPO / "cluster-templates" / name)
    assert m.head.role == "head"


def test_template_shapes():
    local = load_manifest_file(REPO / "cluster-templates" / "local.yaml")
    assert local.accelerator == "cpu" and len(local.nodes) == 1 and local.head.transport == "local"
    assert local.head.ray_cpus(local) >= 8  # stack notes: Serve LLM needs more logical CPUs than cores
    big = load_manifest_file(REPO / "cluster-templates" / "2x8-h100-405b.yaml")
    assert [n.role for n in big.nodes] == ["head", "worker"] and {n.interface for n in big.nodes} == {"ib0"}
    assert big.total_gpus == 16 and big.targets is not None and big.targets.ttft_p95_ms


def test_rules_still_run_beside_an_invalid_value_in_the_same_section():
    problems = problems_of("""\
        name: x
        nodes:
          - {name: a, host: h, role: head, gpus: 1}
          - {name: b, host: h2, gpu: 8}
        ray:
          object_store_memory: 64G
        serve:
          http_port: 6379
        """)
    assert problems == [
        "cluster.yaml:4: nodes[1].gpu: unknown key 'gpu' (did you mean 'gpus'?)",  # one mistake: gpus is not "required" on top
        "cluster.yaml:6: ray.object_store_memory: unknown unit 'G' in '64G' (use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)",
        "cluster.yaml:8: serve.http_port: port 6379 is also used by ray.port (Ray GCS) on the head node",
    ]


def test_an_invalid_value_is_reported_once_not_again_by_rules_on_its_default():
    problems = problems_of("""\
        name: x
        ssh: {port: 2200}
        nodes:
          - {name: a, host: h, role: head, gpus: "8", port: 22}
          - {name: b, host: h, gpus: 1, port: twenty-two}
        ray: {port: "8000"}
        serve: {http_port: 6379}
        """)
    assert problems == [
        "cluster.yaml:4: nodes[0].gpus: must be a whole number (got '8')",
        "cluster.yaml:5: nodes[1].port: must be a whole number (got 'twenty-two')",
        "cluster.yaml:6: ray.port: must be a whole number (got '8000')",
    ]


# ---- never a traceback: anything that is not a manifest becomes ManifestError ----

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-70000, 70000), st.floats(allow_nan=False),
                     st.text(max_size=12), st.sampled_from(["head", "worker", "gpu", "cpu", "8GiB", "ib0", "~/x", "../p"]))
_keys = st.one_of(st.sampled_from(["name", "nodes", "host", "role", "gpus", "port", "ray", "serve", "ssh", "env",
                                   "interface", "transport", "object_store_memory", "http_port", "targets", "gpu"]),
                  st.text(max_size=8))
_documents = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_keys, inner, max_size=6)), max_leaves=30)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents)
def test_any_yaml_document_gives_a_manifest_or_manifest_error(document):
    text = yaml.safe_dump(document)
    try:
        load_manifest(text, Path("/c/cluster.yaml"))
    except ManifestError as exc:
        assert exc.problems and all(p.startswith("/c/cluster.yaml") for p in exc.problems)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_gives_a_manifest_or_manifest_error(text):
    try:
        load_manifest(text, Path("c.yaml"))
    except ManifestError as exc:
        assert exc.problems and all(p.startswith("c.yaml") for p in exc.problems)


def test_deep_nesting_is_an_error_not_a_crash():
    assert problems_of("[" * 1500 + "]" * 1500) == ["cluster.yaml:1: invalid YAML: nested too deeply to be a manifest"]


def test_json_round_trip_keeps_content_and_fingerprint():
    for name in ("local.yaml", "1x8-h100.yaml", "2x8-h100-405b.yaml"):
        m = load_manifest_file(REPO / "cluster-templates" / name)
        again = Manifest.model_validate_json(m.model_dump_json())
        assert again == m.model_copy(update={"source_path": None})
        assert again.fingerprint() == m.fingerprint()


def test_manifests_built_in_code_obey_the_cross_field_rules():
    with pytest.raises(pydantic.ValidationError, match=r"nodes\[1\]\.role: a second head"):
        Manifest(name="x", nodes=[{"name": "a", "host": "h1", "role": "head", "gpus": 1},
                                  {"name": "b", "host": "h2", "role": "head", "gpus": 1}])
    ok = Manifest(name="x", accelerator="cpu", nodes=[{"name": "a", "host": "h1", "role": "head"}])
    assert ok.head.name == "a"


# ---- field checks at their boundaries, with their whole messages ----

NODE = "nodes: [{name: a, host: %s, role: head, gpus: 1%s}]\n"
LONGEST_HOST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters: the DNS limit


@pytest.mark.parametrize(("body", "problem"), [
    ("name: _x\n" + NODE % ("h", ""), "name: '_x' is not a valid name: use 1-63 letters, digits, '-', '_' or '.', "
     "starting with a letter or digit (it names files and Ray labels)"),
    ("name: x\nenv: {1X: a}\n" + NODE % ("h", ""), "env['1X']: '1X' is not a valid environment variable name "
     "(letters, digits and '_', not starting with a digit)"),
    ("name: x\n" + NODE % ("h", ", interface: 'eth0,eth1'"), "nodes[0].interface: 'eth0,eth1' names several "
     "interfaces; give one (a list for NCCL alone goes in env NCCL_SOCKET_IFNAME)"),
    ("name: x\n" + NODE % ("h", ", interface: abcdefghijklmnop"), "nodes[0].interface: 'abcdefghijklmnop' is 16 bytes; "
     "Linux interface names have at most 15"),
    ("name: x\n" + NODE % ("h", ", interface: 'eth\u00e9'"), "nodes[0].interface: 'eth\u00e9' is not a valid interface "
     "name (no '/', ':' or spaces; e.g. ib0, eth0, ens1f0)"),
    ("name: x\n" + NODE % ("h", ", interface: '.'"), "nodes[0].interface: '.' is not a valid interface name "
     "(no '/', ':' or spaces; e.g. ib0, eth0, ens1f0)"),
    ("name: x\n" + NODE % ("h", ", interface: '..'"), "nodes[0].interface: '..' is not a valid interface name "
     "(no '/', ':' or spaces; e.g. ib0, eth0, ens1f0)"),
    ("name: x\n" + NODE % ("'a:b:22'", ""), "nodes[0].host: 'a:b:22' is not a host name or address; put the SSH port in 'port'"),
    ("name: x\n" + NODE % ("'a:b'", ""), "nodes[0].host: 'a:b' is not a valid host name or IP address"),
    ("name: x\n" + NODE % ("bad_host.example.", ""), "nodes[0].host: 'bad_host.example.' is not a valid host name or IP address"),
    ("name: x\n" + NODE % (LONGEST_HOST + "d", ""), f"nodes[0].host: '{LONGEST_HOST}d' is not a valid host name or IP address"),
    ("name: x\nssh: {user: '-x'}\n" + NODE % ("h", ""), "ssh.user: '-x' is not a valid user name"),
    ("name: x\n" + NODE % ("'  '", ""), "nodes[0].host: must not be empty"),
    ("name: x\nray: {object_store_memory: 8 GiB of it}\n" + NODE % ("h", ""), "ray.object_store_memory: '8 GiB of it' is "
     "not a size; write bytes (8589934592) or a number and a unit (8GiB, 500MB)"),
    ("name: x\nray: {object_store_memory: 1.5B}\n" + NODE % ("h", ""), "ray.object_store_memory: '1.5B' is not a whole number of bytes"),
])  # fmt: skip
def test_field_checks_give_their_whole_message(body, problem):
    problems = problems_of(body)
    assert len(problems) == 1 and problems[0].split(": ", 1)[1] == problem, problems


@pytest.mark.parametrize(("body", "field", "value"), [
    (NODE % ("gpu1.example.com.", ""), "host", "gpu1.example.com."),  # a fully qualified name (trailing dot)
    (NODE % ("a.b.", ""), "host", "a.b."),
    (NODE % ("'fd00::12'", ""), "host", "fd00::12"),  # IPv6: its colons are not a port
    (NODE % (LONGEST_HOST, ""), "host", LONGEST_HOST),
    (NODE % ("h", ", interface: abcdefghijklmno"), "interface", "abcdefghijklmno"),  # 15 bytes: the longest
    (NODE % ("h", ", interface: ethX0"), "interface", "ethX0"),
])  # fmt: skip
def test_values_at_the_limits_are_accepted(body, field, value):
    assert getattr(load("name: x\n" + body).nodes[0], field) == value


def test_sizes_at_the_limits_are_accepted():
    # YAML 1.1 reads 8.0e+9 as a float (8.0e9, without the sign, is a string: the size parser takes that too)
    assert load("name: x\nray: {object_store_memory: 8.0e+9}\n" + NODE % ("h", "")).ray.object_store_memory == 8_000_000_000
    smallest = 75 * 1024 * 1024  # Ray's OBJECT_STORE_MINIMUM_MEMORY_BYTES
    assert load(f"name: x\nray: {{object_store_memory: {smallest}}}\n" + NODE % ("h", "")).ray.object_store_memory == smallest
    temp = "/tmp/" + "t" * 31  # 36 bytes: the longest temp dir Ray's dashboard sockets allow (test_haproxy_private.py)
    assert load(f"name: x\nray: {{temp_dir: {temp}}}\n" + NODE % ("h", "")).ray.temp_dir == temp
    with pytest.raises(ManifestError, match="ray.temp_dir"):
        load(f"name: x\nray: {{temp_dir: {temp}t}}\n" + NODE % ("h", ""))


def test_summary_of_one_gpu_and_of_mixed_gpu_types():
    one = load("name: one\nnodes: [{name: a, host: h, role: head, gpus: 1}]\n")
    assert one.summary() == "cluster 'one' - 1 node (1 head), 1 GPU, ray :6379"
    mixed = load("""\
        name: mixed
        nodes:
          - {name: a, host: h1, role: head, gpus: 8, gpu_type: H100-80GB}
          - {name: b, host: h2, gpus: 4, gpu_type: A100-40GB}
        """)
    assert mixed.summary() == "cluster 'mixed' - 2 nodes (1 head, 1 worker), 12 GPUs (A100-40GB, H100-80GB), ray :6379"


def test_unknown_node_name_is_a_key_error_naming_it():
    with pytest.raises(KeyError) as info:
        load(TWO_GPU_NODES).node("zz")
    assert info.value.args == ("zz",)


def test_serve_url_is_the_heads_address_and_servings_port():
    # RFC 3986 section 3.2.2: an IPv6 literal in a URL's host is written in square brackets; a name or
    # an IPv4 address is written as is.
    def url(host: str, serve: str = "") -> str:
        return load(f"name: x\n{serve}nodes: [{{name: a, host: '{host}', role: head, gpus: 1}}]\n").serve_url()

    assert url("10.0.0.1") == "http://10.0.0.1:8000"
    assert url("gpu-a.example.org", "serve: {http_port: 8443}\n") == "http://gpu-a.example.org:8443"
    assert url("fd00::1") == "http://[fd00::1]:8000"
    assert url("2001:db8::10", "serve: {http_port: 9000}\n") == "http://[2001:db8::10]:9000"


# Sizes beyond what decimal arithmetic or Ray can hold. The raylet reads --object_store_memory as an int64
# (src/ray/raylet/main.cc: DEFINE_int64(object_store_memory, -1, ...)), so 2**63 - 1 bytes is the most.
RAY_INT64_MAX = 9_223_372_036_854_775_807


@pytest.mark.parametrize(("size", "problem"), [
    ('"1e999999GiB"', "'1e999999GiB' is not a size"),  # decimal.Overflow: was an internal error
    ('"1e99999999999999999999"', "'1e99999999999999999999' is not a size"),  # beyond decimal's exponents
    ('"1e-9999999"', "'1e-9999999' is not a whole number of bytes"),  # rounded to 0 bytes before
    ('"1e5000"', f"'1e5000' is more than {RAY_INT64_MAX} bytes, the most Ray takes"),  # was accepted
    ('"8388608 TiB"', f"'8388608 TiB' is more than {RAY_INT64_MAX} bytes, the most Ray takes"),  # 2**63 bytes
    ("9223372036854775808", f"9223372036854775808 bytes is more than {RAY_INT64_MAX}, the most Ray takes (a 64-bit integer)"),
    ("1.0e+30", f"1000000000000000019884624838656 bytes is more than {RAY_INT64_MAX}, the most Ray takes (a 64-bit integer)"),
])  # fmt: skip
def test_sizes_beyond_decimal_or_ray_limits_are_refused_with_the_reason(size, problem):
    problems = problems_of(f"name: x\nray: {{object_store_memory: {size}}}\n" + NODE % ("h", ""))
    assert len(problems) == 1 and problems[0].split(": ", 1)[1] == f"ray.object_store_memory: {problem}", problems


def test_the_largest_size_ray_takes_is_accepted_and_whole_floats_become_ints():
    body = f"name: x\nray: {{object_store_memory: {RAY_INT64_MAX}}}\n" + NODE % ("h", "")
    assert load(body).ray.object_store_memory == RAY_INT64_MAX
    assert load(body.replace(str(RAY_INT64_MAX), f'"{RAY_INT64_MAX}"')).ray.object_store_memory == RAY_INT64_MAX
    assert load(body.replace(str(RAY_INT64_MAX), '"8191 TiB"')).ray.object_store_memory == 8191 * 2**40
    # YAML reads 0.0 and 8.0e+9 as floats: a whole, non-negative one is a number of bytes (an int)
    assert [(parse_size(v), type(parse_size(v))) for v in (0.0, 8.0e9)] == [(0, int), (8_000_000_000, int)]
    # anything else that is not text is left as it is, for the type check to name
    assert [parse_size(v) for v in (-1.0, 2.5, None, 7)] == [-1.0, 2.5, None, 7] and parse_size(True) is True


def test_an_slo_needs_a_latency_bound_and_a_positive_target_rate():
    problems = problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        slo:
          target_rps: 0
        """)
    assert problems == ["cluster.yaml:4: slo.target_rps: must be greater than 0 (got 0)"]
    problems = problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        slo:  # !
          target_rps: 5
        """)
    assert len(problems) == 1 and problems[0].startswith("cluster.yaml:3: slo: "), problems
    assert "set ttft_p95_ms or tpot_p95_ms" in problems[0]
    m = load("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        slo: {ttft_p95_ms: 800, target_rps: 12.5}
        """)
    assert (m.slo.ttft_p95_ms, m.slo.tpot_p95_ms, m.slo.max_error_rate, m.slo.target_rps) == (800.0, None, 0.01, 12.5)
    assert m.objective is m.slo  # goodput and the SLO gate judge by slo:, else targets:


def test_the_objective_falls_back_to_targets_and_a_router_must_be_known():
    m = load("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        targets: {tpot_p95_ms: 40}
        """)
    assert m.objective is m.targets and m.serve.request_router == "default" and m.serve.autoscaling is False
    problems = problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        serve:
          request_router: prefix  # !
        """)
    assert len(problems) == 1 and problems[0].startswith("cluster.yaml:4: serve.request_router: ")
    assert "must be 'default' or 'session_affinity' (got 'prefix')" in problems[0], problems
    # The router orch once offered gets its reason, at its line, not the bare list of choices.
    problems = problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        serve: {http_port: 8000,
          request_router: prefix_affinity}
        """)
    assert len(problems) == 1 and problems[0].startswith("cluster.yaml:4: serve.request_router: prefix_affinity is no longer offered: ")
    assert "sends every request to one replica; use session_affinity" in problems[0], problems

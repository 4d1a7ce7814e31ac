"""The cross-field rules of cluster.yaml (manifest/crossfield.py), each with the whole list of
problems a manifest gets, so that a rule that reports too much, too little or at the wrong field
fails. The rules are the ones docs/manifest.md ("Rules across fields") states; Ray's fixed ports
(client server 10001, dashboard agent 52365, worker range 10002-19999) come from ray 2.60.0's
``ray_constants.py`` and ``scripts.py`` as cited there.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from orchestrator.errors import ManifestError
from orchestrator.manifest.crossfield import format_path
from orchestrator.manifest.load import load_manifest
from orchestrator.manifest.model import Manifest


def load(text: str) -> Manifest:
    return load_manifest(textwrap.dedent(text), Path("cluster.yaml"))


def problems_of(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load(text)
    return info.value.problems


# ---- field paths as the problems print them ----


@pytest.mark.parametrize(("path", "text"), [
    (("nodes", 2, "gpus"), "nodes[2].gpus"),
    (("ray", "port"), "ray.port"),
    (("env", "A B"), "env['A B']"),
    (("env", "1X"), "env['1X']"),
    (("nodes", 0, "env", "NCCL_IB_HCA"), "nodes[0].env.NCCL_IB_HCA"),
    (("serve", "api-key"), "serve.api-key"),
    ((0, "x"), "[0].x"),
    ((), ""),
])  # fmt: skip
def test_field_paths_read_like_the_yaml(path, text):
    assert format_path(path) == text


# ---- exactly one head ----


def test_every_head_after_the_first_is_reported():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, role: head, gpus: 1}
          - {name: c, host: h3, role: head, gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[1].role: a second head; nodes[0] is already the head and a cluster has exactly one",
        "cluster.yaml:5: nodes[2].role: a second head; nodes[0] is already the head and a cluster has exactly one",
    ]


def test_no_head_is_not_claimed_while_a_role_is_misspelt():
    # 'wroker' may be the misspelt head: only the typo is reported, not a missing head on top
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: haed, gpus: 1}
          - {name: b, host: h2, gpus: 1}
        """) == ["cluster.yaml:3: nodes[0].role: must be 'head' or 'worker' (got 'haed'); did you mean 'head'?"]


def test_no_head_is_not_claimed_while_a_node_is_not_a_mapping():
    # the node written as a scalar may be the head
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, gpus: 1}
          - b
        """) == ["cluster.yaml:4: nodes[1]: must be a mapping of keys (got 'b')"]


def test_no_head_among_nodes_that_are_all_workers():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: worker, gpus: 1}
        """) == [
        "cluster.yaml:2: nodes: no node has 'role: head'; exactly one node must be the head "
        "(it runs the Ray GCS, dashboard and Serve controller)"
    ]


def test_a_head_with_an_invalid_field_still_counts_as_the_head():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: many}
          - {name: b, host: h2, gpus: 1}
        """) == ["cluster.yaml:3: nodes[0].gpus: must be a whole number (got 'many')"]


# ---- unique names, one local node ----


def test_every_repeat_of_a_name_points_at_the_first():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: a, host: h2, gpus: 1}
          - {name: b, host: h3, gpus: 1}
          - {name: a, host: h4, gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[1].name: duplicate node name 'a' (also nodes[0])",
        "cluster.yaml:6: nodes[3].name: duplicate node name 'a' (also nodes[0])",
    ]


def test_every_local_node_after_the_first_is_reported():
    assert problems_of("""\
        name: x
        accelerator: cpu
        nodes:
          - {name: a, host: 127.0.0.1, role: head, transport: local}
          - {name: b, host: 127.0.0.2, transport: local, port: 23}
          - {name: c, host: 127.0.0.3, transport: local, port: 24}
        """) == [
        "cluster.yaml:5: nodes[1].transport: only one node can be the machine orch runs on; nodes[0] already has 'transport: local'",
        "cluster.yaml:6: nodes[2].transport: only one node can be the machine orch runs on; nodes[0] already has 'transport: local'",
    ]


# ---- GPU counts against the accelerator ----


def test_gpu_counts_on_a_gpu_cluster():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, gpus: 0}
          - {name: c, host: h3}
          - {name: d, host: h4, gpus: 8}
        """) == [
        "cluster.yaml:4: nodes[1].gpus: must be at least 1 on a gpu cluster (got 0)",
        "cluster.yaml:5: nodes[2].gpus: required on a gpu cluster: how many GPUs this node has (e.g. 8)",
    ]


def test_a_cpu_cluster_takes_zero_gpus_written_or_not():
    m = load("""\
        name: x
        accelerator: cpu
        nodes:
          - {name: a, host: h1, role: head, gpus: 0}
          - {name: b, host: h2}
        """)
    assert [n.gpus for n in m.nodes] == [0, 0]
    assert problems_of("""\
        name: x
        accelerator: cpu
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[0].gpus: must be 0 on a cpu cluster (got 1); set 'accelerator: gpu' to use GPUs"
    ]


def test_an_unknown_accelerator_is_reported_once_not_with_gpu_rules_on_top():
    assert problems_of("""\
        name: x
        accelerator: neuron
        nodes:
          - {name: a, host: h1, role: head}
        """) == ["cluster.yaml:2: accelerator: must be 'gpu' or 'cpu' (got 'neuron')"]


def test_an_invalid_gpu_count_is_told_once_with_the_accelerators_bound():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: -2}
        """) == ["cluster.yaml:3: nodes[0].gpus: must be at least 1 on a gpu cluster (got -2)"]


# ---- host + SSH port ----


def test_the_same_host_is_the_same_whatever_its_case_or_trailing_dot():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: gpu1.example.com, role: head, gpus: 1}
          - {name: b, host: GPU1.Example.com., gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[1].host: 'GPU1.Example.com.' port 22 is already nodes[0]; each node needs its own host or SSH port"
    ]


def test_one_host_with_two_ssh_ports_is_two_nodes():
    m = load("""\
        name: x
        accelerator: cpu
        ssh: {port: 2201}
        nodes:
          - {name: a, host: 10.0.0.1, role: head}
          - {name: b, host: 10.0.0.1, port: 2202}
        """)
    assert [n.ssh_port(m) for n in m.nodes] == [2201, 2202]


def test_a_node_port_equal_to_the_cluster_ssh_port_is_the_same_address():
    assert problems_of("""\
        name: x
        ssh: {port: 2201}
        nodes:
          - {name: a, host: 10.0.0.1, role: head, gpus: 1}
          - {name: b, host: 10.0.0.1, port: 2201, gpus: 1}
        """) == [
        "cluster.yaml:5: nodes[1].host: '10.0.0.1' port 2201 is already nodes[0]; each node needs its own host or SSH port"
    ]


def test_an_invalid_ssh_port_leaves_the_address_rule_out():
    # the nodes' addresses are unknown while ssh.port is invalid: only the invalid port is reported
    assert problems_of("""\
        name: x
        ssh: {port: 0}
        nodes:
          - {name: a, host: 10.0.0.1, role: head, gpus: 1}
          - {name: b, host: 10.0.0.1, gpus: 1}
        """) == ["cluster.yaml:2: ssh.port: must be at least 1 (got 0)"]


def test_an_invalid_host_is_not_compared():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: 'bad host', role: head, gpus: 1}
          - {name: b, host: 'bad host', gpus: 1}
        """) == [
        "cluster.yaml:3: nodes[0].host: 'bad host' is not a valid host name or IP address",
        "cluster.yaml:4: nodes[1].host: 'bad host' is not a valid host name or IP address",
    ]


# ---- Ray's worker port range ----


@pytest.mark.parametrize(("section", "field", "port", "problem"), [
    ("ray", "port", 10002, "10002 is inside Ray's worker port range 10002-19999; `ray start` refuses it"),
    ("ray", "port", 19999, "19999 is inside Ray's worker port range 10002-19999; `ray start` refuses it"),
    ("ray", "dashboard_port", 10002, "10002 is inside Ray's worker port range 10002-19999; `ray start` refuses it"),
    ("serve", "http_port", 19999, "19999 is inside Ray's worker port range 10002-19999 (used on every node); pick another, e.g. 8000"),
])  # fmt: skip
def test_ports_inside_rays_worker_range(section, field, port, problem):
    assert problems_of(f"""\
        name: x
        nodes: [{{name: a, host: h, role: head, gpus: 1}}]
        {section}: {{{field}: {port}}}
        """) == [f"cluster.yaml:3: {section}.{field}: {problem}"]


@pytest.mark.parametrize("port", [20000, 9999])
def test_ports_just_outside_rays_worker_range_are_fine(port):
    m = load(f"""\
        name: x
        nodes: [{{name: a, host: h, role: head, gpus: 1}}]
        ray: {{dashboard_port: {port}}}
        serve: {{http_port: {port + 1}}}
        """)
    assert (m.ray.dashboard_port, m.serve.http_port) == (port, port + 1)


# ---- ports one node binds twice ----


def test_a_worker_sshd_on_the_serve_port_clashes_on_that_worker():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, port: 8000, gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[1].port: port 8000 is also used by serve.http_port (Ray Serve HTTP proxy, every node) on node 'b'"
    ]


def test_a_worker_sshd_on_the_gcs_port_is_fine():
    # the GCS and the dashboard listen on the head only
    m = load("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, port: 6379, gpus: 1}
          - {name: c, host: h3, port: 8265, gpus: 1}
          - {name: d, host: h4, port: 10001, gpus: 1}
        """)
    assert [n.port for n in m.workers] == [6379, 8265, 10001]


def test_a_worker_sshd_on_the_dashboard_agent_port_clashes():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, port: 52365, gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[1].port: port 52365 is also used by the Ray dashboard agent (every node) on node 'b'"
    ]


def test_the_head_sshd_on_the_dashboard_port_clashes_on_the_head():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, port: 8265, role: head, gpus: 1}
        """) == [
        "cluster.yaml:3: nodes[0].port: port 8265 is also used by ray.dashboard_port (Ray dashboard) on node 'a'"
    ]


def test_the_cluster_ssh_port_on_a_ray_port_is_reported_at_ssh_port():
    assert problems_of("""\
        name: x
        ssh:
          port: 6379
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
        """) == ["cluster.yaml:3: ssh.port: port 6379 is also used by ray.port (Ray GCS) on node 'a'"]


def test_a_clash_is_reported_at_the_field_the_file_sets():
    # serve.http_port keeps its default 8000; the ray.port written in the file is the one to change
    assert problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          port: 8000
        """) == [
        "cluster.yaml:4: ray.port: port 8000 is also used by serve.http_port (Ray Serve HTTP proxy, every node) on the head node"
    ]


def test_a_clash_of_two_defaults_with_both_written_is_reported_at_the_later_field():
    assert problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          port: 7000
          dashboard_port: 7000
        """) == ["cluster.yaml:5: ray.dashboard_port: port 7000 is also used by ray.port (Ray GCS) on the head node"]


def test_a_clash_is_reported_once_at_each_node_it_happens_on():
    # sshd on 8000 on two workers: one problem per node; the head is not involved
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, port: 8000, gpus: 1}
          - {name: c, host: h3, port: 8000, gpus: 1}
        """) == [
        "cluster.yaml:4: nodes[1].port: port 8000 is also used by serve.http_port (Ray Serve HTTP proxy, every node) on node 'b'",
        "cluster.yaml:5: nodes[2].port: port 8000 is also used by serve.http_port (Ray Serve HTTP proxy, every node) on node 'c'",
    ]


def test_a_local_node_has_no_sshd_to_clash():
    m = load("""\
        name: x
        accelerator: cpu
        nodes:
          - {name: a, host: 127.0.0.1, role: head, transport: local, port: 8000}
        """)
    assert m.head.port == 8000


def test_an_invalid_port_takes_part_in_no_clash():
    assert problems_of("""\
        name: x
        nodes: [{name: a, host: h, role: head, gpus: 1}]
        ray:
          port: 70000
        serve:
          http_port: 70000
        """) == [
        "cluster.yaml:4: ray.port: must be at most 65535 (got 70000)",
        "cluster.yaml:6: serve.http_port: must be at most 65535 (got 70000)",
    ]


def test_an_invalid_serve_port_takes_part_in_no_clash_on_a_worker():
    # serve.http_port is invalid: its default (8000) must not be held against a worker's sshd on 8000
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, port: 8000, gpus: 1}
        serve: {http_port: 0}
        """) == ["cluster.yaml:5: serve.http_port: must be at least 1 (got 0)"]


def test_a_clash_with_a_node_sshd_names_the_node_once():
    # the node is in the other side's name already: no " on node 'a'" after it
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h, port: 6379, role: head, gpus: 1}
        ray:
          port: 6379
        """) == ["cluster.yaml:5: ray.port: port 6379 is also used by sshd on node 'a'"]


def test_an_invalid_gpu_count_does_not_stop_the_rule_for_the_next_nodes():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: -2}
          - {name: b, host: h2, gpus: 0}
        """) == [
        "cluster.yaml:3: nodes[0].gpus: must be at least 1 on a gpu cluster (got -2)",
        "cluster.yaml:4: nodes[1].gpus: must be at least 1 on a gpu cluster (got 0)",
    ]


@pytest.mark.parametrize(("field", "problem"), [
    ("port: 0", "nodes[1].port: must be at least 1 (got 0)"),
    ("transport: docker", "nodes[1].transport: must be 'ssh' or 'local' (got 'docker')"),
])  # fmt: skip
def test_a_node_with_an_invalid_port_or_transport_has_no_known_ssh_address(field, problem):
    # its address is unknown, so it is not a duplicate of nodes[0] (h, port 22) on the defaults
    assert problems_of(f"""\
        name: x
        nodes:
          - {{name: a, host: h, role: head, gpus: 1}}
          - {{name: b, host: h, gpus: 1, {field}}}
        """) == [f"cluster.yaml:4: {problem}"]


def test_a_node_with_an_unknown_ssh_address_does_not_stop_the_check_of_the_next_ones():
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h, role: head, gpus: 1, port: 0}
          - {name: b, host: h2, gpus: 1}
          - {name: c, host: h2, gpus: 1}
        """) == [
        "cluster.yaml:3: nodes[0].port: must be at least 1 (got 0)",
        "cluster.yaml:5: nodes[2].host: 'h2' port 22 is already nodes[1]; each node needs its own host or SSH port",
    ]


def test_a_node_with_an_invalid_role_takes_part_in_no_port_clash():
    # which ports it binds depends on its role: it is left out, and only the role is reported
    assert problems_of("""\
        name: x
        nodes:
          - {name: a, host: h1, role: head, gpus: 1}
          - {name: b, host: h2, role: wroker, gpus: 1, port: 8000}
        """) == ["cluster.yaml:4: nodes[1].role: must be 'head' or 'worker' (got 'wroker'); did you mean 'worker'?"]

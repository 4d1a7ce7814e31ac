"""How each kind of invalid value reads (manifest/rules.py): the whole problem line, so that a
message that loses its value, its quote hint or its line fails. One case per branch of the
translation of pydantic errors, and one per way the top level can be wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ManifestError
from orchestrator.manifest.load import load_manifest
from orchestrator.manifest.rules import Problem, manifest_error

NODE = "nodes: [{name: a, host: h, role: head, gpus: 1}]\n"


def problems_of(text: str) -> list[str]:
    with pytest.raises(ManifestError) as info:
        load_manifest(text, Path("c.yaml"))
    assert info.value.exit_code == 2
    return info.value.problems


@pytest.mark.parametrize(("text", "problem"), [
    # whole numbers
    ("name: x\nnodes: [{name: a, host: h, role: head, gpus: 1.5}]\n", "c.yaml:2: nodes[0].gpus: must be a whole number (got 1.5)"),
    ("name: x\nnodes: [{name: a, host: h, role: head, gpus: 1, cpus: 2.0}]\n", "c.yaml:2: nodes[0].cpus: must be a whole number (got 2.0)"),
    # numbers
    ("name: x\n" + NODE + "targets: {ttft_p95_ms: fast}\n", "c.yaml:3: targets.ttft_p95_ms: must be a number (got 'fast')"),
    ("name: x\n" + NODE + "targets: {ttft_p95_ms: true}\n", "c.yaml:3: targets.ttft_p95_ms: must be a number (got true)"),
    # strings: a number is told to be quoted, anything else is not
    ("name: x\nssh: {user: 5}\n" + NODE, "c.yaml:2: ssh.user: must be a string (got 5); quote it"),
    ("name: x\nssh: {user: 5.5}\n" + NODE, "c.yaml:2: ssh.user: must be a string (got 5.5); quote it"),
    ("name: x\nssh: {user: [a]}\n" + NODE, "c.yaml:2: ssh.user: must be a string (got a list)"),
    ("name: x\nssh: {user: {a: 1}}\n" + NODE, "c.yaml:2: ssh.user: must be a string (got a mapping)"),
    ("name: x\nenv: {A: null}\n" + NODE, "c.yaml:2: env.A: must be a string (got null)"),
    ("name: x\nenv: {A: false}\n" + NODE, "c.yaml:2: env.A: must be a string; quote it (\"false\") so YAML does not read it as true/false"),
    # mappings, lists, paths
    ("name: x\nssh: hello\n" + NODE, "c.yaml:2: ssh: must be a mapping of keys (got 'hello')"),
    ("name: x\nenv: [a]\n" + NODE, "c.yaml:2: env: must be a mapping of keys (got a list)"),
    ("name: x\nnodes: hello\n", "c.yaml:2: nodes: must be a list ('- name: ...' items) (got 'hello')"),
    ("name: x\nmodel_store: 5\n" + NODE, "c.yaml:2: model_store: must be a path (got 5)"),
    # bounds, with a whole bound shown without '.0'
    ("name: x\nssh: {connect_timeout: 601}\n" + NODE, "c.yaml:2: ssh.connect_timeout: must be at most 600 (got 601)"),
    ("name: x\nssh: {connect_timeout: -1.5}\n" + NODE, "c.yaml:2: ssh.connect_timeout: must be greater than 0 (got -1.5)"),
    ("name: x\n" + NODE + "targets: {max_error_rate: -0.5}\n", "c.yaml:3: targets.max_error_rate: must be at least 0 (got -0.5)"),
    ("name: x\nray: {num_cpus: 0}\n" + NODE, "c.yaml:2: ray.num_cpus: must be at least 1 (got 0)"),
    # unknown keys: the closest valid key, else every valid key of that mapping
    ("name: x\nnodes: [{name: a, host: h, role: head, gpus: 1, zzz: 1}]\n", "c.yaml:2: nodes[0].zzz: unknown key 'zzz'; "
     "valid keys: name, host, port, user, role, gpus, gpu_type, interface, transport, python, cpus, env"),
    ("name: x\n" + NODE + "targets: {ttft_p59_ms: 5}\n", "c.yaml:3: targets.ttft_p59_ms: unknown key 'ttft_p59_ms' (did you mean 'ttft_p95_ms'?)"),
    ("name: x\n" + NODE + "targets: {zzz: 5}\n", "c.yaml:3: targets.zzz: unknown key 'zzz'; valid keys: ttft_p95_ms, tpot_p95_ms, max_error_rate"),
    ("name: x\nray: {zzz: 5}\n" + NODE, "c.yaml:2: ray.zzz: unknown key 'zzz'; valid keys: port, dashboard_port, temp_dir, "
     "object_store_memory, token_auth, num_cpus"),
    # a choice: the close one is suggested only when there is one
    ("name: x\naccelerator: cpus\n" + NODE, "c.yaml:2: accelerator: must be 'gpu' or 'cpu' (got 'cpus'); did you mean 'cpu'?"),
    ("name: x\naccelerator: 5\n" + NODE, "c.yaml:2: accelerator: must be 'gpu' or 'cpu' (got 5)"),
    # empty
    ("name: x\nnodes: [{name: a, host: h, role: head, gpus: 1, gpu_type: ''}]\n", "c.yaml:2: nodes[0].gpu_type: must not be empty"),
])  # fmt: skip
def test_each_kind_of_invalid_value_reads_as_one_whole_line(text, problem):
    assert problems_of(text) == [problem]


@pytest.mark.parametrize(("text", "problem"), [
    ("- a\n", "c.yaml:1: the top level must be a mapping ('name: ...', 'nodes: ...'), got a list"),
    ("hello\n", "c.yaml:1: the top level must be a mapping ('name: ...', 'nodes: ...'), got 'hello'"),
    ("\n\n5\n", "c.yaml:3: the top level must be a mapping ('name: ...', 'nodes: ...'), got 5"),
    ("true\n", "c.yaml:1: the top level must be a mapping ('name: ...', 'nodes: ...'), got true"),
    ("", "c.yaml:1: the file is empty; a manifest needs at least 'name:' and 'nodes:'"),
    ("# nothing yet\n", "c.yaml:1: the file is empty; a manifest needs at least 'name:' and 'nodes:'"),
    ("name: [x\n", "c.yaml:2: invalid YAML: while parsing a flow sequence, expected ',' or ']', but got '<stream end>' (column 1)"),
])  # fmt: skip
def test_text_that_is_not_a_manifest_reads_as_one_whole_line(text, problem):
    assert problems_of(text) == [problem]


def test_a_value_yaml_could_not_build_is_reported_once():
    # the unknown tag is the problem; the None left in its place is not a second "must be a string"
    assert problems_of("name: x\n" + NODE + "env:\n  A: !!python/name:os.system x\n") == [
        "c.yaml:4: env.A: could not determine a constructor for the tag 'tag:yaml.org,2002:python/name:os.system' (column 6)"
    ]


def test_a_duplicate_key_is_reported_with_the_value_it_kept_checked_too():
    # the duplicate is one problem; the value kept (the last) is still validated
    assert problems_of("name: x\n" + NODE + "serve:\n  http_port: 8000\n  http_port: 0\n") == [
        "c.yaml:5: serve.http_port: duplicate key 'http_port' (first given at line 4)",
        "c.yaml:5: serve.http_port: must be at least 1 (got 0)",
    ]


def test_problems_are_sorted_by_line_then_field_and_told_once():
    problems = [
        Problem(3, ("ray", "port"), "b"),
        Problem(1, (), "first"),
        Problem(None, ("z",), "no line"),
        Problem(3, ("nodes", 0, "gpus"), "a"),
        Problem(3, ("ray", "port"), "b"),
    ]
    error = manifest_error("c.yaml", problems)
    assert error.problems == [
        "c.yaml: z: no line",
        "c.yaml:1: first",
        "c.yaml:3: nodes[0].gpus: a",
        "c.yaml:3: ray.port: b",
    ]
    assert error.message == "c.yaml: 4 problems"
    assert error.exit_code == 2


def test_one_problem_is_the_message_itself():
    error = manifest_error("c.yaml", [Problem(7, ("serve", "http_port"), "must be at least 1 (got 0)")])
    assert error.message == "c.yaml:7: serve.http_port: must be at least 1 (got 0)"
    assert error.problems == [error.message]


def test_a_document_yaml_could_not_build_is_not_called_empty():
    assert problems_of("!!python/name:os.system x\n") == [
        "c.yaml:1: could not determine a constructor for the tag 'tag:yaml.org,2002:python/name:os.system' (column 1)"
    ]


def test_a_source_path_in_the_file_is_one_problem_whatever_its_value():
    # the key is orch's own: its value is not validated on top
    assert problems_of("name: x\nsource_path: 5\n" + NODE) == [
        "c.yaml:2: source_path: set by orch when it reads the file; remove it"
    ]


def test_a_missing_key_is_named_at_its_mapping():
    assert problems_of("name: x\n") == ["c.yaml:1: nodes: required key missing"]
    assert problems_of("name: x\nnodes:\n  - {name: a, role: head, gpus: 1}\n") == [
        "c.yaml:3: nodes[0].host: required key missing"
    ]


def test_a_choice_given_as_a_list_gets_no_suggestion():
    # str(['gpu']) is close enough to 'gpu' for difflib; only a text value is compared with the choices
    assert problems_of("name: x\naccelerator: [gpu]\n" + NODE) == [
        "c.yaml:2: accelerator: must be 'gpu' or 'cpu' (got a list)"
    ]


def test_the_valid_top_level_keys_leave_out_the_one_orch_sets():
    assert problems_of("name: x\ncolour: blue\n" + NODE) == [
        "c.yaml:2: colour: unknown key 'colour'; valid keys: name, accelerator, python, ssh, nodes, ray, model_store, serve, env, targets, slo"
    ]


def test_an_empty_node_list_asks_for_the_head():
    assert problems_of("name: x\nnodes: []\n") == ["c.yaml:2: nodes: must list at least one node (the head)"]


def test_false_is_shown_as_yaml_writes_it():
    assert problems_of("name: false\n" + NODE) == ["c.yaml:1: name: must be a string (got false); quote it"]

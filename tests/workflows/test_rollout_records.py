"""What a rollout deploys from records (issue 12 items 3 and 5): stored configs have their
secrets redacted, so a rollback or a restore puts them back from the manifest or the
environment and never deploys a placeholder; the serving application's name is kept in the
database, and an unknown one refuses instead of reading as "nothing serves"."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from orchestrator.errors import UsageError
from orchestrator.workflows.desired import desired_for_revision
from orchestrator.workflows.rollout import RolloutOptions, execute
from tests.workflows.rollout_world import KEY, MANIFEST, _nodes, make_world

OPTIONS = RolloutOptions(timeout_s=60, probe_timeout_s=10)
SECRET = "hf_secret-value-for-tests"
WITH_SECRET = MANIFEST + f"env: {{HF_TOKEN: {SECRET}, HF_HOME: /models/hf}}\n"
WITHOUT_SECRET = MANIFEST + "env: {HF_HOME: /models/hf}\n"


def _env_vars(app):
    return app["runtime_env"]["env_vars"]


def _rollback(world, options=OPTIONS):
    return execute(world.manifest, desired_for_revision(world.state, "wf", None), KEY, world.deps, options)


def test_rollback_deploys_the_real_secret_not_the_stored_placeholder(tmp_path):
    world = make_world(tmp_path, WITH_SECRET)
    world.rollout(options=OPTIONS)
    world.rollout(options=OPTIONS, max_model_len=2048)
    assert _env_vars(world.state.get_revision("wf", 1).config)["HF_TOKEN"] == "<redacted>"  # what is stored
    res = _rollback(world)
    assert res.action == "side_by_side" and res.revision == 3
    for body in world.serve.bodies[-2:]:  # the candidate's PUT and the switch
        assert "<redacted>" not in json.dumps(body)
        assert all(_env_vars(a)["HF_TOKEN"] == SECRET for a in body["applications"])
    # The same secret: the rolled-back config is revision 1's, fingerprint and all.
    assert world.state.get_revision("wf", 3).config_fingerprint == world.state.get_revision("wf", 1).config_fingerprint
    assert SECRET not in json.dumps(res.to_dict())  # nor is it printed


def test_a_stored_secret_comes_from_the_environment_when_the_manifest_no_longer_has_it(tmp_path):
    first = make_world(tmp_path, WITH_SECRET)
    first.rollout(options=OPTIONS)
    first.rollout(options=OPTIONS, max_model_len=2048)
    world = make_world(tmp_path / "later", WITHOUT_SECRET)
    world.state, world.deps.state, world.serve = first.state, first.state, first.serve
    with pytest.raises(UsageError, match=r"redacted secrets orch does not keep: runtime_env\.env_vars\.HF_TOKEN") as err:
        _rollback(world)
    assert "export" in err.value.hint
    assert len(world.serve.bodies) == 3 and [r.status for r in world.state.list_revisions("wf")] == ["superseded", "ready"]
    world.deps.environ = {"HF_TOKEN": "hf_from-the-environment"}
    _rollback(world)
    assert _env_vars(world.serve.bodies[-1]["applications"][0])["HF_TOKEN"] == "hf_from-the-environment"


def test_an_in_place_change_is_refused_when_its_restore_would_need_a_secret_orch_does_not_have(tmp_path):
    """The restore of an in-place change redeploys the previous revision as Serve reports it; when
    Serve reports no config for it, from the record, which needs the secrets: without them the
    change is refused before anything is applied."""
    first = make_world(tmp_path, WITH_SECRET)
    first.rollout(options=OPTIONS)
    world = make_world(tmp_path / "later", WITHOUT_SECRET)
    world.state, world.deps.state, world.serve = first.state, first.state, first.serve
    real_status = world.serve.status

    def status_without_configs():
        st = real_status()
        return replace(st, applications={n: replace(a, deployed_config={}) for n, a in st.applications.items()})

    world.serve.status = status_without_configs
    world.nodes = _nodes(cpus_used=7.5)
    in_place = RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True)
    with pytest.raises(UsageError, match=r"refusing to replace revision 1 in place.*runtime_env\.env_vars\.HF_TOKEN"):
        world.rollout(options=in_place, max_model_len=2048)
    assert len(world.serve.bodies) == 1
    world.deps.environ = {"HF_TOKEN": SECRET}
    assert world.rollout(options=in_place, max_model_len=2048).action == "in_place"


@pytest.fixture
def world(tmp_path):
    return make_world(tmp_path)


def test_the_application_name_survives_a_lost_meta_file(world):
    world.rollout(options=OPTIONS)
    world.rollout(options=OPTIONS, max_model_len=2048)  # revision 2 serves as orch (side by side)
    world.state.revision_meta_path("wf", 2).unlink()
    assert world.rollout(options=OPTIONS, max_model_len=2048).action == "noop"
    world.state.revision_meta_path("wf", 2).write_text("")  # the torn write of an older orch
    res = world.rollout(options=OPTIONS, max_model_len=4096)
    assert res.action == "side_by_side" and [a["name"] for a in world.serve.bodies[-1]["applications"]] == ["orch"]


def test_an_unknown_application_name_refuses_instead_of_deploying_fresh(world):
    world.rollout(options=OPTIONS)
    # A revision recorded by an older orch: no app_name column value, and its meta file is lost.
    with world.state._connect() as conn:
        conn.execute("UPDATE revisions SET app_name = NULL, config_json = '{}' WHERE number = 1")
    world.state.revision_meta_path("wf", 1).unlink()
    bodies = len(world.serve.bodies)
    # Which model it served is lost with its record too: nothing is known to serve 'tiny', and the
    # application Serve runs is refused rather than replaced.
    with pytest.raises(UsageError, match="no revision serves yet, but Serve runs orch: a fresh deploy would delete it") as err:
        world.rollout(options=OPTIONS, max_model_len=2048)
    assert "--allow-downtime" in err.value.message + (err.value.hint or "")
    assert len(world.serve.bodies) == bodies and set(world.serve.apps) == {"orch"}  # the live app untouched


def test_a_fresh_deploy_never_deletes_a_running_application_without_allow_downtime(world):
    world.rollout(options=OPTIONS)
    # Serve runs an application orch did not record as serving (the record says revision 1's is gone).
    world.serve.apply({"applications": [dict(world.serve.apps["orch"], name="orch-r7")]})
    world.serve.status()
    world.serve.status()
    with pytest.raises(UsageError, match="Serve runs orch-r7: a fresh deploy would delete it"):
        world.rollout(options=OPTIONS, max_model_len=2048)
    assert set(world.serve.apps) == {"orch-r7"}
    res = world.rollout(options=RolloutOptions(timeout_s=60, probe_timeout_s=10, allow_downtime=True), max_model_len=2048)
    assert res.action == "fresh" and set(world.serve.apps) == {"orch"}


def test_a_placeholder_an_older_orch_deployed_is_replaced_not_copied(tmp_path):
    """Before the fix a rollback deployed HF_TOKEN=<redacted>; the next rollout keeps that
    application beside its candidate, and must not PUT the placeholder again."""
    world = make_world(tmp_path, WITH_SECRET)
    world.rollout(options=OPTIONS)
    broken = json.loads(json.dumps(world.serve.apps["orch"]))
    _env_vars(broken)["HF_TOKEN"] = "<redacted>"
    world.serve.apps["orch"] = broken
    world.rollout(options=OPTIONS, max_model_len=2048)
    candidate_put = world.serve.bodies[-2]
    assert "<redacted>" not in json.dumps(candidate_put)
    assert _env_vars(candidate_put["applications"][0])["HF_TOKEN"] == SECRET

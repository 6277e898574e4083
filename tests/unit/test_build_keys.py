"""Build specs and cache keys: validation names the field; keys chain and are canonical."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandpod_contract.builds import BuildStep, TemplateBuild
from sandpod_contract.errors import ResourceInvalid, ResourceNotFound
from sandpod_contract.resources import SandboxTemplateSpec
from sandpod_lifecycle.builds.cache import (
    BuildCache,
    ImageConfig,
    LayerMeta,
    base_key,
    step_key,
)

DIGEST = "sha256:" + "ab" * 32


def test_a_build_round_trips() -> None:
    """from_dict/to_dict keep every step kind."""
    head: list[dict[str, Any]] = [
        {"run": "pip install pandas"},
        {"copy": {"src": DIGEST, "dest": "/app"}},
    ]
    tail: list[dict[str, Any]] = [{"workdir": "/app"}, {"user": "sandbox"}]
    raw = {"from": {"template": "base"}, "steps": [*head, {"env": {"B": "2", "A": "1"}}, *tail]}
    build = SandboxTemplateSpec.from_dict({"build": raw}).build
    assert build is not None and build.to_dict() == {
        "from": {"template": "base"},
        "steps": [*head, {"env": {"A": "1", "B": "2"}}, *tail],
    }


@pytest.mark.parametrize(
    ("build", "field"),
    [
        ({"from": {"image": "a", "template": "b"}}, "spec.build.from"),
        ({"from": {"template": "Bad_Name"}}, "spec.build.from.template"),
        ({"steps": [{"run": ""}]}, "spec.build.steps[0].run"),
        ({"steps": [{"run": "x", "env": {}}]}, "spec.build.steps[0]"),
        ({"steps": [{"shell": "x"}]}, "spec.build.steps[0]"),
        (
            {"steps": [{"run": "x"}, {"copy": {"src": "app/", "dest": "/a"}}]},
            "spec.build.steps[1].copy.src",
        ),
        ({"steps": [{"copy": {"src": DIGEST, "dest": "app"}}]}, "spec.build.steps[0].copy.dest"),
        ({"steps": [{"workdir": "/a/../b"}]}, "spec.build.steps[0].workdir"),
        ({"steps": [{"env": {"1X": "v"}}]}, "spec.build.steps[0].env.1X"),
        ({"steps": [{"user": "Root Admin"}]}, "spec.build.steps[0].user"),
        ({"steps": "run x"}, "spec.build.steps"),
        ({"stages": []}, "spec.build"),
    ],
)
def test_invalid_builds_name_the_field(build: dict[str, Any], field: str) -> None:
    """Each malformed part of a build is ResourceInvalid naming its field."""
    with pytest.raises(ResourceInvalid) as info:
        SandboxTemplateSpec.from_dict({"build": build})
    assert info.value.details["field"] == field


def test_keys_chain_and_ignore_key_order() -> None:
    """A step's key depends on its parent and its canonical JSON, not on map order."""
    base = base_key({"rootfs": "/srv/base"})
    a = BuildStep.from_dict("s", {"env": {"A": "1", "B": "2"}})
    b = BuildStep.from_dict("s", {"env": {"B": "2", "A": "1"}})
    assert step_key(base, a) == step_key(base, b)
    other = base_key({"rootfs": "/srv/other"})
    assert step_key(other, a) != step_key(base, a)
    run = BuildStep.from_dict("s", {"run": "make"})
    assert step_key(step_key(base, a), run) != step_key(step_key(base, run), a)
    copy1 = BuildStep.from_dict("s", {"copy": {"src": DIGEST, "dest": "/a"}})
    copy2 = BuildStep.from_dict("s", {"copy": {"src": "sha256:" + "cd" * 32, "dest": "/a"}})
    assert step_key(base, copy1) != step_key(base, copy2)  # new files, new layer


def test_config_steps_accumulate() -> None:
    """env merges, workdir and user replace; run leaves the config alone."""
    config = ImageConfig()
    for raw in ({"env": {"A": "1"}}, {"workdir": "/x"}, {"env": {"A": "2", "B": "3"}}):
        config = config.apply(BuildStep.from_dict("s", raw))
    config = config.apply(BuildStep.from_dict("s", {"run": "true"}))
    assert config == ImageConfig(env=(("A", "2"), ("B", "3")), workdir="/x")


def test_the_cache_walks_a_chain_back_to_its_base(tmp_path: Path) -> None:
    """chain(): the base's directory, the layers bottom first (config-only entries have
    none), the last config; a missing entry is ResourceNotFound."""
    cache = BuildCache(tmp_path / "build")
    base = base_key({"rootfs": "/srv/base"})
    cache.put(LayerMeta(base, "", "base", "base", False, ImageConfig(), rootfs="/srv/base"))
    run = BuildStep.from_dict("s", {"run": "true"})
    env = BuildStep.from_dict("s", {"env": {"A": "1"}})
    k1, fs = step_key(base, run), cache.scratch("x") / "fs"
    fs.mkdir()
    cache.put(LayerMeta(k1, base, "run", "run true", True, ImageConfig()), fs)
    k2 = step_key(k1, env)
    cache.put(LayerMeta(k2, k1, "env", "env A=1", False, ImageConfig(env=(("A", "1"),))))
    chain = cache.chain(k2)
    assert chain.rootfs == Path("/srv/base") and chain.keys == (base, k1, k2)
    assert chain.layers == (tmp_path / "build" / k1 / "fs",)
    assert chain.config.env == (("A", "1"),)
    with pytest.raises(ResourceNotFound):
        cache.chain(step_key(k2, run))


def test_the_result_is_never_on_the_wire() -> None:
    """TemplateBuild.result (filled by lifecycle from the status) is not in to_dict."""
    build = TemplateBuild.from_dict({"steps": [{"run": "x"}]})
    assert build is not None
    assert "result" not in build.to_dict()


def test_an_image_base_chain_stacks_the_image_layers_with_no_rootfs(tmp_path: Path) -> None:
    """An image base: its key is its manifest digest's (a re-pushed tag is another base), its
    layers are the chain's bottom and no rootfs lies below them; its meta survives a reread."""
    cache = BuildCache(tmp_path / "build")
    base = base_key({"image": "sha256:" + "a" * 64})
    assert base != base_key({"image": "sha256:" + "b" * 64})
    img = (str(tmp_path / "l1"), str(tmp_path / "l2"))
    conf = ImageConfig(env=(("APP", "1"),), workdir="/app")
    cache.put(LayerMeta(base, "", "image", "image x", False, conf, image_layers=img))
    run = BuildStep.from_dict("s", {"run": "true"})
    k1, fs = step_key(base, run), cache.scratch("x") / "fs"
    fs.mkdir()
    cache.put(LayerMeta(k1, base, "run", "run true", True, conf), fs)
    chain = cache.chain(k1)
    assert chain.rootfs is None
    assert chain.layers == (tmp_path / "l1", tmp_path / "l2", tmp_path / "build" / k1 / "fs")
    assert chain.config.workdir == "/app"

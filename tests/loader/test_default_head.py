"""Which shipped head a registry model gets: its own, or under tensor parallelism the one that
reads no target feature layers."""

import json

import pytest

from speculant.loader import head_file


def _ship(root, name, feature_layers):
    (root / name).mkdir()
    (root / name / "head.json").write_text(json.dumps({"variant": "eagle3" if feature_layers else "normed", "feature_layers": feature_layers}))


@pytest.fixture
def heads(tmp_path, monkeypatch):
    monkeypatch.setattr(head_file, "HEADS_DIR", tmp_path)
    return tmp_path


def test_the_models_own_head_when_the_target_hands_over_features(heads):
    _ship(heads, "m", [2, 15, 27])
    _ship(heads, "m-normed", [])
    assert head_file.default_head("m") == heads / "m"


def test_a_feature_head_falls_back_to_the_normed_one_under_tensor_parallelism(heads):
    _ship(heads, "m", [2, 15, 27])
    _ship(heads, "m-normed", [])
    assert head_file.default_head("m", target_features=False) == heads / "m-normed"


def test_a_normed_default_serves_both(heads):
    _ship(heads, "m", [])
    assert head_file.default_head("m", target_features=False) == heads / "m"


def test_no_fallback_is_an_error_naming_the_model_and_what_ships(heads):
    _ship(heads, "m", [2, 15, 27])
    with pytest.raises(ValueError, match=r"no head that reads no feature layers .*'m'.*\['m'\]"):
        head_file.default_head("m", target_features=False)
    with pytest.raises(ValueError, match=r"no head ships for model 'other'"):
        head_file.default_head("other")

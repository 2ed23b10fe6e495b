"""Every decoder family transformers registers: it plans (layer groups and page sizes), or fails with a typed
error naming what is missing.

The walk covers each ``model_type`` of transformers' causal-LM and image-text-to-text auto mappings, with its
default config (``AutoConfig.for_model(t)``).  A config transformers itself cannot build with defaults
(e.g. encoder-decoder wrappers that need sub-configs) describes no model and is skipped.  Split into
chunks so xdist spreads the meta-device builds of the state-space families.
"""

from __future__ import annotations

import logging
import warnings

import pytest

from jenga.core.pagesize import manager_page_plan
from jenga.core.specs import ModelSpec
from jenga.errors import JengaError
from jenga.structure import model_spec_from_hf_config

CHUNKS = 4


def decoder_types() -> list[str]:
    from transformers.models.auto import modeling_auto as ma

    return sorted(set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES) | set(ma.MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES))


def test_walk_covers_the_registered_decoders():
    assert len(decoder_types()) > 200


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_every_registered_decoder_plans_or_names_what_is_missing(chunk):
    from transformers import AutoConfig

    logging.getLogger("transformers").setLevel(logging.ERROR)
    planned, refused, raw, unbuilt = [], {}, {}, []
    types = decoder_types()[chunk::CHUNKS]
    for t in types:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cfg = AutoConfig.for_model(t)
        except Exception:  # noqa: BLE001 - transformers cannot build this default: no model to plan
            unbuilt.append(t)
            continue
        try:
            spec = model_spec_from_hf_config(cfg)
            manager_page_plan(spec)  # the page sizes `jenga plan` would use
        except JengaError as e:
            refused[t] = str(e)
        except Exception as e:  # noqa: BLE001 - the point of the test: no raw traceback
            raw[t] = f"{type(e).__name__}: {e}"
        else:
            assert isinstance(spec, ModelSpec) and spec.groups
            assert sum(g.num_layers for g in spec.groups) >= 1
            planned.append(t)
    assert not raw, raw
    # a floor on what was walked: transformers builds all but one or two defaults per chunk (of ~63)
    assert len(types) >= 50 and len(unbuilt) <= 3, unbuilt
    for t, msg in refused.items():  # each refusal names the config and the fact
        assert ("'" in msg or "layer" in msg) and len(msg) > 30, (t, msg)
    assert len(planned) >= 0.9 * (len(planned) + len(refused)), refused

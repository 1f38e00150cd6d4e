"""What the multi-process tier's fork server imports once for every rank it forks
(tests/multiproc.py): the runtime, the test helpers the ranks run, and Hugging Face's model classes
(5 s of imports that each rank of an HF test would otherwise repeat)."""

import transformers  # noqa: F401
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401

import dapple_launch.models.hf
import dapple_launch.runtime.executor
import dapple_launch.runtime.module
import dapple_launch.runtime.p2p  # noqa: F401
import tests.test_pipeline_numerics  # noqa: F401

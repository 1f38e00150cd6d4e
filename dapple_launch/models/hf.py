"""Any Hugging Face causal LM from a directory, as a pipeline: its embedding, each decoder layer, and
its final norm + head, with the family's own module code (the `transformers` package) doing the compute.

Generic over decoder-only families whose model has that shape (Llama, Qwen, Mistral, Gemma, GPT-2,
...), not a list of names. What a layer needs besides the hidden states (position ids, rotary
embeddings, the attention mask of its kind: full or sliding) is rebuilt on each stage by the family's
own base-model code: the base model runs with its decoder layers swapped for one `_Probe`, which
records the arguments the family passes to a layer and stops. So rotary frequencies, embedding scales
and masks come from the family's code, never from a copy of it here. The head runs the family's whole
causal-LM forward with the layers swapped for a `_Replay` of the stage's hidden states: its final norm,
its head, its logit scaling or soft-capping.

Each pipeline layer holds a "shell": the family's causal-LM class built with no decoder layers, with
the parts the layer does not own replaced by parameter-free stand-ins. Parameter names map one to one
onto the Hugging Face names (`hf_name`), so a rank reads only its stage's tensors from the
safetensors files and export writes them back (export.py).
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .contract import LayerSpec, PipelineModel
from .weight_files import WeightFiles, weight_files


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ValueError(
            "model=hf needs the transformers package: pip install 'dapple-launch[hf]' "
            "(transformers, safetensors, tokenizers)"
        ) from None
    return transformers


def _text(config):
    """The config of a model's text part (the model's own config where it has no other part)."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def load_config(path: str | Path):
    p = Path(path).expanduser()
    if not (p / "config.json").is_file():
        raise ValueError(
            f"{p}: no config.json there; a Hugging Face model directory (what save_pretrained writes) "
            f"holds config.json and *.safetensors"
        )
    t = _transformers()
    try:
        return t.AutoConfig.from_pretrained(str(p), local_files_only=True)
    except Exception as exc:
        raise ValueError(
            f"{p}/config.json cannot be read by transformers: {' '.join(str(exc).split())[:300]}"
        ) from None


class _Stop(Exception):
    pass


class _Probe(nn.Module):
    """Stands where the decoder layers stand: records what the family passes to a layer, then stops."""

    def __init__(self, attention_type: str | None):
        super().__init__()
        self.attention_type = attention_type  # families that mix full and sliding layers pick the mask by it
        self.seen = None

    def forward(self, *args, **kwargs):
        self.seen = (args, kwargs)
        raise _Stop


class _Replay(nn.Module):
    """Stands where the decoder layers stand on the head's stage: hands the stage's hidden states on."""

    def __init__(self, hidden: torch.Tensor, as_tuple: bool, attention_type: str | None):
        super().__init__()
        self.hidden, self.as_tuple, self.attention_type = hidden, as_tuple, attention_type

    def forward(self, *args, **kwargs):
        return (self.hidden,) if self.as_tuple else self.hidden


class _ZeroEmbedding(nn.Module):
    """A stage that does not own the embedding: the family's code still calls it (GPT-2 adds position
    embeddings to given inputs), and what it returns is never used there. Its first argument gives
    the shape: the ids, or the attention mask OPT's positions are counted from."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, ids, *args, **kwargs):
        return torch.zeros(*ids.shape, self.dim, device=ids.device)


class Anatomy:
    """Where a family keeps its parts, read from its causal-LM class built on the meta device."""

    def __init__(self, config):
        t = _transformers()
        self.config = config
        text = _text(config)
        self.num_layers = int(getattr(text, "num_hidden_layers", 0) or 0)
        try:
            with torch.device("meta"):
                full = t.AutoModelForCausalLM.from_config(copy.deepcopy(config))
        except ValueError:
            raise ValueError(
                f"{type(config).__name__} (model_type {config.model_type}, architectures "
                f"{getattr(config, 'architectures', None)}) is not a causal LM: transformers has no "
                f"AutoModelForCausalLM class for it, and this tool pipelines decoder-only models of the "
                f"embed → layers → norm + head shape"
            ) from None
        arch = type(full).__name__
        self.arch = arch
        # the attention kernel from_config picked for this family (sdpa, or eager where it must be)
        self.attn_implementation = full.config._attn_implementation
        # The decoder layers: the shallowest ModuleList of num_hidden_layers entries that is not inside
        # a list (an MoE layer's experts can number as many). The base model is the top-level part
        # holding it, whatever base_model_prefix says (Gemma 3's and Llama 4's text models name
        # "language_model" but hold "model"); the list may sit deeper in it (OPT: decoder.layers).
        lists = [
            n
            for n, m in full.named_modules()
            if isinstance(m, nn.ModuleList)
            and len(m) == self.num_layers
            and "." in n
            and not any(part.isdigit() for part in n.split("."))
        ]
        shallowest = min((n.count(".") for n in lists), default=0)
        lists = [n for n in lists if n.count(".") == shallowest]
        head = full.get_output_embeddings()
        embeds = [n for n, m in full.named_modules() if isinstance(m, nn.Embedding)]
        found = ", ".join(f"{n} ({type(m).__name__})" for n, m in full.named_children())
        if len(lists) != 1 or head is None or not embeds or self.num_layers < 1:
            raise ValueError(
                f"{arch} does not follow the embed → layers → norm + head shape this tool pipelines: "
                f"it holds {found}"
                + ("" if head is not None else "; no output embeddings")
                + f" (looked for one list of {self.num_layers} decoder layers and an embedding)"
            )
        self.prefix, _, self.layers_name = lists[0].partition(".")
        base = full.get_submodule(self.prefix)
        self.layer_class = type(base.get_submodule(self.layers_name)[0])
        self.layer_types = list(getattr(text, "layer_types", None) or [])
        self.tied = (
            bool(getattr(config, "tie_word_embeddings", False)) and head.weight is full.get_input_embeddings().weight
        )
        self.head_name = next(n for n, m in full.named_modules() if m is head)
        self.input_name = next(n for n, m in full.named_modules() if m is full.get_input_embeddings())
        self.state_shapes = {k: tuple(v.shape) for k, v in full.state_dict().items()}
        self.embed_side = _run_before_layers(config, self)  # what the embedding stage owns; the head owns the rest

    def attention_type(self, i: int) -> str | None:
        return self.layer_types[i] if i < len(self.layer_types) else None

    def layer_prefix(self, i: int) -> str:
        return f"{self.prefix}.{self.layers_name}.{i}."

    def base(self, shell: nn.Module) -> nn.Module:
        """The part of a causal-LM shell that runs the decoder layers (what the family calls for hidden states)."""
        return shell.get_submodule(self.prefix)

    def swap_layers(self, shell: nn.Module, layers: nn.ModuleList) -> nn.ModuleList:
        """Put `layers` where the shell's decoder layers stand; returns what stood there."""
        owner, _, leaf = f"{self.prefix}.{self.layers_name}".rpartition(".")
        parent = shell.get_submodule(owner)
        original = getattr(parent, leaf)
        setattr(parent, leaf, layers)
        return original


def _build_shell(config, anatomy: Anatomy, keep: str) -> nn.Module:
    """The family's causal-LM class with no decoder layers; keep = "embed", "head" or "none" (the
    parts a stage does not own become parameter-free stand-ins). What the embedding stage owns is
    every part holding weights that the family runs before its first decoder layer (the token and
    position embeddings; Bloom's embedding norm, OPT's input projection); the head owns the rest."""
    shell = _zero_layer_model(config, anatomy)
    leaves = _weighted_leaves(shell)
    before = anatomy.embed_side
    for name, module in leaves.items():
        if (keep == "embed" and name in before) or (keep == "head" and name not in before):
            continue
        parent_name, _, leaf = name.rpartition(".")
        parent = shell.get_submodule(parent_name) if parent_name else shell
        is_embed = isinstance(module, nn.Embedding)
        setattr(parent, leaf, _ZeroEmbedding(module.embedding_dim) if is_embed else nn.Identity())
    shell.train()
    return shell


def _zero_layer_model(config, anatomy: Anatomy) -> nn.Module:
    """The family's causal-LM class built with no decoder layers, its config then saying how many
    the model has (the family's code may slice its layer list by that count)."""
    t = _transformers()
    cfg = copy.deepcopy(config)
    text = _text(cfg)
    text.num_hidden_layers = 0
    shell = t.AutoModelForCausalLM.from_config(cfg)
    for c in {id(shell.config): shell.config, id(anatomy.base(shell).config): anatomy.base(shell).config}.values():
        _text(c).num_hidden_layers = anatomy.num_layers
    return shell


def _weighted_leaves(shell: nn.Module) -> dict[str, nn.Module]:
    return {
        name: module
        for name, module in shell.named_modules()
        if name and not list(module.children()) and any(True for _ in module.parameters(recurse=False))
    }


def _run_before_layers(config, anatomy: Anatomy) -> frozenset[str]:
    """The parts holding weights that the family's base model calls before its first decoder layer,
    on a few token ids: the order of the family's own code, not a guess from module types. Run on a
    real zero-layer model with a small vocabulary (the embedding's size does not change what runs
    first), whatever mode the caller is in: a shapes-only trace (profile/analytic.py) cannot run a
    family's mask code, which reads values."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    cfg = copy.deepcopy(config)
    text = _text(cfg)
    text.vocab_size = 64
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(text, name, None), int) and getattr(text, name) >= 64:
            setattr(text, name, 0)
    with unset_fake_temporarily(), torch.device("cpu"):
        shell = _zero_layer_model(cfg, anatomy)
        leaves = _weighted_leaves(shell)
        ran: set[str] = set()

        def seen(name: str):
            return lambda module, args: ran.add(name)

        hooks = [m.register_forward_pre_hook(seen(name)) for name, m in leaves.items()]
        try:
            with torch.no_grad():
                probe(shell, anatomy, anatomy.attention_type(0), input_ids=torch.zeros(1, 4, dtype=torch.long))
        finally:
            for h in hooks:
                h.remove()
    return frozenset(ran)


class _Shells:
    """Per process: one parameter-free shell per device, for the layers' arguments, and those
    arguments per (shape, dtype, device, kind of attention), computed once."""

    def __init__(self, config, anatomy):
        self.config, self.anatomy = config, anatomy
        self.shells: dict = {}
        self.inputs: dict = {}
        self.lock = threading.Lock()

    def layer_inputs(self, hidden: torch.Tensor, attention_type: str | None):
        key = (tuple(hidden.shape), hidden.dtype, str(hidden.device), attention_type, torch.is_autocast_enabled())
        found = self.inputs.get(key)
        if found is None:
            with self.lock:
                dev = str(hidden.device)
                if dev not in self.shells:
                    self.shells[dev] = _build_shell(self.config, self.anatomy, "none").to(hidden.device)
                _, rest, kwargs = probe(self.shells[dev], self.anatomy, attention_type, inputs_embeds=hidden.detach())
                found = self.inputs[key] = (rest, kwargs)
        return found


def shapes_only(fn, shell: nn.Module):
    """fn(), which runs a family's code around its layers on `shell`. Where that code reads a value a
    shapes-only trace does not have (profile/analytic.py; OPT asks whether its mask is all ones and
    draws whether to drop a layer), again as torch.export traces it, with
    torch.compiler.is_compiling() true (the families then take their paths that read no values),
    and with the shell in eval mode (no layer drop; its dropout, which holds no weights, runs as
    identity). Only then: on real tensors, and on fake ones where they suffice, the family's own path
    runs as in training, so the trace counts what a real run computes and saves."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    try:
        return fn()
    except (DataDependentOutputException, DynamicOutputShapeException):
        training = shell.training
        flags = {name: getattr(torch.compiler, name, False) for name in ("_is_compiling_flag", "_is_exporting_flag")}
        shell.eval()
        try:
            for name in flags:  # what torch.export sets while it traces (torch._export.utils._compiling_state_context)
                setattr(torch.compiler, name, True)
            return fn()
        finally:
            for name, value in flags.items():
                setattr(torch.compiler, name, value)
            shell.train(training)


def probe(shell, anatomy: Anatomy, attention_type, **inputs):
    """Run the family's base model up to its first decoder layer: (hidden, other args, kwargs)."""
    p = _Probe(attention_type)
    original = anatomy.swap_layers(shell, nn.ModuleList([p]))
    # The probe stands at index 0. Families pick a layer's mask (and Gemma 3 its rotary table) by the
    # layer's own attention_type (transformers 4) or by config.layer_types[i] of the loop's index
    # (transformers 5): for the second, layer 0 is said to be of the kind asked for while it runs.
    text: Any = _text(anatomy.base(shell).config)
    types = getattr(text, "layer_types", None)
    if attention_type is not None and types:
        text.layer_types = [attention_type, *types[1:]]

    def run():
        try:
            anatomy.base(shell)(**inputs, use_cache=False)
        except _Stop:
            pass

    try:
        shapes_only(run, shell)
    finally:
        anatomy.swap_layers(shell, original)
        if attention_type is not None and types:
            text.layer_types = types
    if p.seen is None:
        raise RuntimeError(f"{anatomy.arch}'s base model never reached its decoder layers")
    args, kwargs = p.seen
    hidden = args[0] if args else kwargs.pop("hidden_states")
    return hidden, tuple(args[1:]), kwargs


class HFEmbed(nn.Module):
    def __init__(self, config, anatomy):
        super().__init__()
        self.anatomy = anatomy
        self.shell = _build_shell(config, anatomy, "embed")

    def forward(self, ids):
        hidden, _, _ = probe(self.shell, self.anatomy, self.anatomy.attention_type(0), input_ids=ids)
        return hidden


class HFDecoder(nn.Module):
    def __init__(self, config, anatomy, index: int, shells: _Shells):
        super().__init__()
        self.anatomy, self.index = anatomy, index
        self.attention_type = anatomy.attention_type(index)
        self._shells = [shells]  # a list: not a submodule (no weights; one per process)
        self.layer = _make_layer(anatomy, config, index)

    def forward(self, hidden):
        rest, kwargs = self._shells[0].layer_inputs(hidden, self.attention_type)
        out = self.layer(hidden, *rest, **kwargs)
        return out[0] if isinstance(out, tuple) else out


def _make_layer(anatomy: Anatomy, config, index: int) -> nn.Module:
    import inspect

    text = copy.copy(_text(config))
    text._attn_implementation = anatomy.attn_implementation  # what the family's own model would have set
    params = list(inspect.signature(anatomy.layer_class.__init__).parameters)[2:]  # (after self, config)
    # the layer's index, under the name its family gives it (layer_idx; GPT-Neo's layer_id; ...)
    named = [p for p in params if p in ("layer_idx", "layer_id", "layer_index", "layer_number", "layer_num")]
    return anatomy.layer_class(text, **{named[0]: index}) if named else anatomy.layer_class(text)


class HFHead(nn.Module):
    def __init__(self, config, anatomy):
        super().__init__()
        self.anatomy = anatomy
        self.shell = _build_shell(config, anatomy, "head")
        self._as_tuple: bool | None = None

    def forward(self, hidden):
        original = self.anatomy.swap_layers(self.shell, nn.ModuleList())
        attention_type = self.anatomy.attention_type(self.anatomy.num_layers - 1)
        tries = [self._as_tuple] if self._as_tuple is not None else [False, True]
        try:
            for as_tuple in tries:  # how the family reads a layer's output: learned on the first call
                self.anatomy.swap_layers(self.shell, nn.ModuleList([_Replay(hidden, as_tuple, attention_type)]))
                try:
                    logits = shapes_only(
                        lambda: self.shell(inputs_embeds=hidden.detach(), use_cache=False).logits, self.shell
                    )
                except (TypeError, AttributeError, IndexError, RuntimeError):
                    continue  # (GPT-BigCode takes the tensor's first row for the tuple's and fails to view it)
                if logits.dim() == 3 and logits.shape[:2] == hidden.shape[:2]:
                    self._as_tuple = as_tuple
                    return logits
        finally:
            self.anatomy.swap_layers(self.shell, original)
        raise RuntimeError(
            f"{self.anatomy.arch}: its causal-LM forward does not take the decoder layers' output "
            f"as a tensor or a tuple"
        )


class HFCausalLM(PipelineModel):
    """A Hugging Face causal LM: layers = [embed, decoder 0 … n-1, norm + head]."""

    name = "hf"
    seq_len: int
    vocab_size: int
    trace_on_fake_tensors = True  # (profile/analytic.py) the family's code needs a real device type

    def __init__(
        self, path: str | None = None, config_dir: str | None = None, init: str = "pretrained", seq_len: int = 128
    ):
        source = path or config_dir
        if not source:
            raise ValueError(
                "model=hf needs model.path=DIR (config.json and safetensors weights) or "
                "model.config=DIR with model.init=random"
            )
        if init == "pretrained" and not path:
            raise ValueError(
                "model.init=pretrained reads the weights of model.path=DIR; with only model.config, set "
                "model.init=random"
            )
        self.path, self.init = (str(Path(path).expanduser()) if path else None), init
        self.config = load_config(source)
        self.anatomy = Anatomy(self.config)
        text = _text(self.config)
        self.vocab_size = int(text.vocab_size)
        limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
        if limit and seq_len > limit:
            raise ValueError(
                f"model.seq_len={seq_len} is longer than {self.anatomy.arch}'s {limit} positions "
                f"(max_position_embeddings); set model.seq_len<={limit}"
            )
        self.seq_len = int(seq_len)
        self._shells = _Shells(self.config, self.anatomy)
        if init == "pretrained":
            self.check_weights()

    # ---- weights ---------------------------------------------------------------------------------
    def expected(self) -> dict[str, tuple]:
        """HF tensor name → shape, as the family's model stores it (a tied head is stored once)."""
        shapes = dict(self.anatomy.state_shapes)
        if self.anatomy.tied:
            shapes.pop(f"{self.anatomy.head_name}.weight", None)
        return shapes

    def hf_config(self):
        return self.config

    def hf_expected(self) -> set[str]:
        return set(self.expected())

    def check_weights(self) -> None:
        assert self.path is not None, "only pretrained weights are checked"
        found = WeightFiles(self.path).shapes()
        for name, shape in self.expected().items():
            if name not in found:
                version = _transformers().__version__
                raise ValueError(
                    f"{self.path}: the weights have no tensor {name} (shape {list(shape)}), which "
                    f"{self.anatomy.arch} needs; the directory holds another model or lost a shard"
                    + (
                        f", or transformers {version} names this family's tensors otherwise than its files "
                        f"do (version 5 converts some families' stored tensors as it loads them, mixtures "
                        f"of experts among them; model=hf reads the stored names: pip install 'transformers<5')"
                        if int(version.split(".")[0]) >= 5
                        else ""
                    )
                )
            if tuple(found[name]) != shape:
                raise ValueError(
                    f"{self.path}: tensor {name} has shape {list(found[name])}, but {self.anatomy.arch} "
                    f"with this config.json needs {list(shape)}"
                )

    def hf_name(self, position: int, name: str) -> str:
        """The Hugging Face name of parameter `name` of pipeline layer `position`."""
        if position == 0 or position == self.anatomy.num_layers + 1:
            return name.removeprefix("shell.")
        return self.anatomy.layer_prefix(position - 1) + name.removeprefix("layer.")

    def _load(self, position: int, module: nn.Module) -> nn.Module:
        if self.init != "pretrained" or any(_shapes_only(p) for p in module.parameters()):
            return module  # random: the family's own initialisation; meta: shapes only (profiling)
        files = weight_files(self.path)
        with torch.no_grad():
            for name, tensor in module.state_dict().items():
                hf = self.hf_name(position, name)
                if hf not in files.where and self.anatomy.tied and hf == f"{self.anatomy.head_name}.weight":
                    hf = f"{self.anatomy.input_name}.weight"
                if hf not in files.where:
                    continue  # a buffer the family builds itself (not stored by save_pretrained)
                tensor.copy_(files.get(hf).to(tensor.dtype))
        return module

    def _init(self, module: nn.Module) -> nn.Module:
        """The family's own initialisation (its _init_weights), as from_config would apply it."""
        if self.init == "random":
            shell: Any = _init_shell(self)  # (a PreTrainedModel: its _init_weights)
            for m in module.modules():
                if not isinstance(m, (_ZeroEmbedding, nn.Identity)):
                    shell._init_weights(m)
        return module

    # ---- the contract ----------------------------------------------------------------------------
    def layers(self) -> list[LayerSpec]:
        a, cfg = self.anatomy, self.config
        specs = [LayerSpec("embed", lambda: self._load(0, self._init(HFEmbed(cfg, a))))]
        for i in range(a.num_layers):
            specs.append(
                LayerSpec(f"layer{i}", lambda i=i: self._load(i + 1, self._init(HFDecoder(cfg, a, i, self._shells))))
            )
        specs.append(LayerSpec("head", lambda: self._load(a.num_layers + 1, self._init(HFHead(cfg, a)))))
        return specs

    def tied_parameters(self):
        if not self.anatomy.tied:
            return ()
        return (
            [
                f"layers.0.shell.{self.anatomy.input_name}.weight",
                f"layers.{self.anatomy.num_layers + 1}.shell.{self.anatomy.head_name}.weight",
            ],
        )

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        token = F.cross_entropy(output.float().flatten(0, 1), target.flatten(), ignore_index=-100, reduction="none")
        counted = (target != -100).sum(1).clamp(min=1)
        return token.view(target.shape).sum(1) / counted

    def batch(self, n, generator=None, device="cpu"):
        ids = torch.randint(0, self.vocab_size, (n, self.seq_len + 1), generator=generator).to(device)
        return ids[:, :-1], ids[:, 1:]

    def describe(self) -> dict:
        return {"name": "hf", "architecture": self.anatomy.arch, "config": self.config.to_diff_dict()}


def _shapes_only(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return t.device.type == "meta" or isinstance(t, FakeTensor)


def _init_shell(model: HFCausalLM) -> nn.Module:
    shells = model._shells
    with shells.lock:
        if "init" not in shells.shells:
            shells.shells["init"] = _build_shell(model.config, model.anatomy, "none")
    return shells.shells["init"]

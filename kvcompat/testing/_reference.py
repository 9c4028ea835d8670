"""Pure-torch stand-ins for SGLang 0.5.23's KV pools, for users without SGLang.

Each class takes SGLang's constructor parameters (same names, same order; the
required ones get convenient defaults here) and reproduces the behaviour a
consumer observes: attribute names, buffer shapes, dtypes and page geometry,
getter results, exceptions and messages — including SGLang's quirks, such as
``get_key_buffer(layer_id)`` silently reading another layer for ids below
``start_layer``. The conformance tests prove them equal to the real classes.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import Any

import torch

from kvcompat._families import Family, _install, qualified_name
from kvcompat._protocol import PoolKind
from kvcompat.adapters._leaf import LatentAdapter, SingleKVAdapter, SplitAdapter
from kvcompat.adapters.sglang import SWA_PARTS, adapt_swa
from kvcompat.layouts._registry import KV_LAYOUT_NAMES

__all__ = [
    "KVLayout",
    "RecordingLayerCounter",
    "ReferenceDeepSeekV4SingleKVPool",
    "ReferenceMHATokenToKVPool",
    "ReferenceMLATokenToKVPool",
    "ReferenceSWAKVPool",
    "reference_swa_pool",
]

_FP8 = (torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e4m3fnuz)


class KVLayout(str, enum.Enum):
    """The names of SGLang's DeepSeek-V4 ``KVLayout`` enum values.

    Example:
        >>> from kvcompat.testing import KVLayout
        >>> KVLayout("v4").value
        'v4'
    """

    V4 = "v4"
    V41 = "v41"
    V41_FP4 = "v41_fp4"
    UNIFORM_FP8 = "uniform_fp8"
    V41_NEW = "v41_new"
    V41_FP4_NEW = "v41_fp4_new"


def _check_kv_layouts() -> None:
    """``KVLayout`` names exactly the registry's SGLang ``KVLayout`` values."""
    declared = {member.value for member in KVLayout}
    registered = set(KV_LAYOUT_NAMES)
    if declared != registered:
        msg = (
            f"kvcompat.testing.KVLayout names {sorted(declared)}, but the layout registry's "
            f"SGLang KVLayout values are {sorted(registered)} (layout modules with "
            "SGLANG_KV_LAYOUT = True).\nHint: add the missing members to KVLayout in "
            "kvcompat/testing/_reference.py."
        )
        raise ImportError(msg)


_check_kv_layouts()


class RecordingLayerCounter:
    """A stand-in for SGLang's ``LayerDoneCounter`` that records every wait.

    Register it with ``pool.register_layer_transfer_counter(counter)`` and
    check which layer indices a getter waited on.

    Example:
        >>> import kvcompat
        >>> from kvcompat.testing import RecordingLayerCounter, ReferenceMHATokenToKVPool
        >>> native = ReferenceMHATokenToKVPool(size=16, page_size=16, layer_num=2, start_layer=3)
        >>> counter = RecordingLayerCounter()
        >>> native.register_layer_transfer_counter(counter)
        >>> _ = kvcompat.adapt(native).get_key_buffer(4)
        >>> counter.waits
        [1]
    """

    def __init__(self) -> None:
        self.waits: list[int] = []

    def wait_until(self, threshold: int) -> None:
        """Record the wait (SGLang makes the current stream wait on a load event)."""
        self.waits.append(threshold)


class _ReferenceKVCache:
    """Attributes SGLang's ``KVCache.__init__`` sets, with the same rules."""

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype,
        layer_num: int,
        device: str,
        start_layer: int | None,
        end_layer: int | None,
    ) -> None:
        self.size = size
        self.page_size = page_size
        self.dtype = dtype
        self.device = device
        self.store_dtype = torch.uint8 if dtype in _FP8 else dtype
        self.layer_num = layer_num
        self.start_layer = start_layer or 0
        # SGLang's rule, kept on purpose: ignores start_layer.
        self.end_layer = end_layer or layer_num - 1
        self.layer_transfer_counter: Any = None
        self.mem_usage = 0.0

    def register_layer_transfer_counter(self, layer_transfer_counter: Any) -> None:
        """Install a layer-transfer counter that the getters wait on."""
        self.layer_transfer_counter = layer_transfer_counter

    def _wait(self, layer_id: int) -> None:
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)


def _layer_of(layer: Any, layer_id_override: int | None) -> int:
    if layer_id_override is not None:
        return layer_id_override
    return int(layer.layer_id) if hasattr(layer, "layer_id") else int(layer)


def _loc_of(loc_info: Any) -> torch.Tensor:
    loc = getattr(loc_info, "loc", loc_info)
    if not isinstance(loc, torch.Tensor):
        msg = f"loc must be a tensor of token indices, got {type(loc).__name__}."
        raise TypeError(msg)
    return loc


class ReferenceMHATokenToKVPool(_ReferenceKVCache):
    """SGLang 0.5.23 ``MHATokenToKVPool`` (NHD layout), in pure torch.

    Buffers: ``k_buffer[i]`` ``[size + page_size, head_num, head_dim]`` and
    ``v_buffer[i]`` ``[..., v_head_dim]`` of ``store_dtype`` (``uint8`` for fp8).
    When K and V shapes match they are the two halves of one
    ``[2, rows padded to a page, head_num, head_dim]`` allocation, as in SGLang.

    Example:
        >>> from kvcompat.testing import ReferenceMHATokenToKVPool
        >>> pool = ReferenceMHATokenToKVPool(16, 16, head_num=2, head_dim=8, layer_num=2)
        >>> pool.get_key_buffer(1).shape
        torch.Size([32, 2, 8])
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype = torch.bfloat16,
        head_num: int = 1,
        head_dim: int = 128,
        layer_num: int = 1,
        device: str = "cpu",
        enable_memory_saver: bool = False,
        v_head_dim: int | None = None,
        swa_head_num: int | None = None,
        swa_head_dim: int | None = None,
        swa_v_head_dim: int | None = None,
        start_layer: int | None = None,
        end_layer: int | None = None,
        enable_alt_stream: bool = True,
        enable_kv_cache_copy: bool = False,
        kv_cache_layout: str | None = None,
        quant_method: Any = None,
        post_capture_active: bool = False,
        allocation_label: str | None = None,
    ) -> None:
        _reject_unmodelled(
            "ReferenceMHATokenToKVPool",
            enable_memory_saver=enable_memory_saver,
            kv_cache_layout=kv_cache_layout not in (None, "nhd") and kv_cache_layout,
            quant_method=quant_method,
            post_capture_active=post_capture_active,
        )
        super().__init__(size, page_size, dtype, layer_num, device, start_layer, end_layer)
        self.head_num = swa_head_num if swa_head_num is not None else head_num
        self.head_dim = swa_head_dim if swa_head_dim is not None else head_dim
        if swa_v_head_dim is not None:
            self.v_head_dim = swa_v_head_dim
        else:
            self.v_head_dim = v_head_dim if v_head_dim is not None else head_dim
        self.kv_cache_layout = "nhd"
        self.allocation_label = allocation_label
        rows = size + page_size
        k_shape = (rows, self.head_num, self.head_dim)
        v_shape = (rows, self.head_num, self.v_head_dim)
        if k_shape == v_shape:
            padded = math.ceil(rows / page_size) * page_size
            fused = [
                torch.zeros((2, padded, *k_shape[1:]), dtype=self.store_dtype, device=device)
                for _ in range(layer_num)
            ]
            self.k_buffer = [buf[0, :rows] for buf in fused]
            self.v_buffer = [buf[1, :rows] for buf in fused]
        else:
            self.k_buffer = [
                torch.zeros(k_shape, dtype=self.store_dtype, device=device)
                for _ in range(layer_num)
            ]
            self.v_buffer = [
                torch.zeros(v_shape, dtype=self.store_dtype, device=device)
                for _ in range(layer_num)
            ]
        self.model_layer_ids = tuple(range(self.start_layer, self.start_layer + layer_num))
        k_size, v_size = self.get_kv_size_bytes()
        self.mem_usage = (k_size + v_size) / (1 << 30)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """Bytes of all K buffers and of all V buffers, as SGLang counts them."""
        k_size = sum(buf.numel() * buf.element_size() for buf in self.k_buffer)
        v_size = sum(buf.numel() * buf.element_size() for buf in self.v_buffer)
        return k_size, v_size

    def _get_key_buffer(self, layer_id: int) -> torch.Tensor:
        local = layer_id - self.start_layer
        if self.store_dtype != self.dtype:
            return self.k_buffer[local].view(self.dtype)
        return self.k_buffer[local]

    def _get_value_buffer(self, layer_id: int) -> torch.Tensor:
        local = layer_id - self.start_layer
        if self.store_dtype != self.dtype:
            return self.v_buffer[local].view(self.dtype)
        return self.v_buffer[local]

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Wait for the layer, then return ``k_buffer[layer_id - start_layer]``."""
        self._wait(layer_id)
        return self._get_key_buffer(layer_id)

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Wait for the layer, then return ``v_buffer[layer_id - start_layer]``."""
        self._wait(layer_id)
        return self._get_value_buffer(layer_id)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer(l), get_value_buffer(l))`` — waits twice, like SGLang."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def get_v_head_dim(self) -> int:
        """The value head dim."""
        return self.v_head_dim

    def set_kv_buffer(
        self,
        layer: Any,
        loc_info: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float | None = None,
        v_scale: float | None = None,
        layer_id_override: int | None = None,
    ) -> None:
        """Scatter ``cache_k``/``cache_v`` rows at ``loc`` (SGLang's plain NHD path).

        Like SGLang, dividing by ``k_scale``/``v_scale`` happens in place on the
        caller's tensors when they already have the pool dtype.
        """
        layer_id = _layer_of(layer, layer_id_override)
        loc = _loc_of(loc_info)
        if cache_k.dtype != self.dtype:
            if k_scale is not None:
                cache_k.div_(k_scale)
            if v_scale is not None:
                cache_v.div_(v_scale)
            cache_k = cache_k.to(self.dtype)
            cache_v = cache_v.to(self.dtype)
        if self.store_dtype != self.dtype:
            cache_k = cache_k.view(self.store_dtype)
            cache_v = cache_v.view(self.store_dtype)
        local = layer_id - self.start_layer
        self.k_buffer[local][loc] = cache_k
        self.v_buffer[local][loc] = cache_v

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` of K buffers then V buffers, as SGLang."""
        buffers = [*self.k_buffer, *self.v_buffer]
        ptrs = [buf.data_ptr() for buf in buffers]
        lens = [buf.nbytes for buf in buffers]
        items = [buf[0].nbytes * self.page_size for buf in buffers]
        return ptrs, lens, items


class ReferenceMLATokenToKVPool(_ReferenceKVCache):
    """SGLang 0.5.23 ``MLATokenToKVPool``, in pure torch.

    ``kv_buffer[i]`` is ``[size + page_size, 1, kv_lora_rank + qk_rope_head_dim]``;
    the value is the non-contiguous view of its first ``kv_lora_rank`` columns.
    ``set_kv_buffer`` writes the whole row from ``cache_k`` and ignores
    ``cache_v``, as SGLang does.

    Example:
        >>> from kvcompat.testing import ReferenceMLATokenToKVPool
        >>> pool = ReferenceMLATokenToKVPool(size=16, page_size=16, layer_num=1)
        >>> k, v = pool.get_kv_buffer(0)
        >>> k.shape, v.shape, v.is_contiguous()
        (torch.Size([32, 1, 576]), torch.Size([32, 1, 512]), False)
    """

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype = torch.bfloat16,
        kv_lora_rank: int = 512,
        qk_rope_head_dim: int = 64,
        layer_num: int = 1,
        device: str = "cpu",
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        use_dsa: bool = False,
        override_kv_cache_dim: int | None = None,
        dcp_replicated: bool = False,
    ) -> None:
        _reject_unmodelled(
            "ReferenceMLATokenToKVPool",
            enable_memory_saver=enable_memory_saver,
            use_dsa=use_dsa,
            dcp_replicated=dcp_replicated,
        )
        super().__init__(size, page_size, dtype, layer_num, device, start_layer, end_layer)
        self.kv_lora_rank = kv_lora_rank
        self.qk_rope_head_dim = qk_rope_head_dim
        self.use_dsa = use_dsa
        self.dsa_kv_cache_store_fp8 = False
        self.kv_cache_dim = kv_lora_rank + qk_rope_head_dim
        self.kv_scale_buffer = None
        self.model_layer_ids = tuple(range(self.start_layer, self.start_layer + layer_num))
        self.kv_buffer = [
            torch.zeros(
                (size + page_size, 1, self.kv_cache_dim), dtype=self.store_dtype, device=device
            )
            for _ in range(layer_num)
        ]
        self.mem_usage = self.get_kv_size_bytes() / (1 << 30)

    def get_kv_size_bytes(self) -> int:
        """Bytes of all latent buffers."""
        return sum(buf.numel() * buf.element_size() for buf in self.kv_buffer)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """Wait, then the full latent row buffer of the layer."""
        self._wait(layer_id)
        if self.store_dtype != self.dtype:
            return self.kv_buffer[layer_id - self.start_layer].view(self.dtype)
        return self.kv_buffer[layer_id - self.start_layer]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Wait, then the ``[..., :kv_lora_rank]`` view of the latent rows."""
        self._wait(layer_id)
        rows = self.kv_buffer[layer_id - self.start_layer][..., : self.kv_lora_rank]
        if self.store_dtype != self.dtype:
            return rows.view(self.dtype)
        return rows

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(get_key_buffer(l), get_value_buffer(l))``."""
        return self.get_key_buffer(layer_id), self.get_value_buffer(layer_id)

    def set_kv_buffer(
        self,
        layer: Any,
        loc: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor | None = None,
        *args: Any,
        layer_id_override: int | None = None,
        **kwargs: Any,
    ) -> None:
        """Write whole latent rows from ``cache_k``; ``cache_v`` is ignored (as in SGLang)."""
        layer_id = _layer_of(layer, layer_id_override)
        index = _loc_of(loc)
        if cache_k.dtype != self.dtype:
            cache_k = cache_k.to(self.dtype)
        if self.store_dtype != self.dtype:
            cache_k = cache_k.view(self.store_dtype)
        self.kv_buffer[layer_id - self.start_layer][index] = cache_k

    def set_mla_kv_buffer(
        self,
        layer: Any,
        loc_info: Any,
        cache_k_nope: torch.Tensor,
        cache_k_rope: torch.Tensor,
        layer_id_override: int | None = None,
    ) -> None:
        """Write the nope and rope parts of the latent rows.

        Like SGLang's MLA row writer, rows addressed to the reserved padding slot
        0 are skipped.
        """
        loc = _loc_of(loc_info)
        row = torch.cat([cache_k_nope, cache_k_rope], dim=-1)
        keep = loc != 0
        self.set_kv_buffer(layer, loc[keep], row[keep], None, layer_id_override=layer_id_override)

    def get_contiguous_buf_infos(self) -> tuple[list[int], list[int], list[int]]:
        """``(data_ptrs, data_lens, item_lens)`` per layer, item = one page of rows."""
        ptrs = [buf.data_ptr() for buf in self.kv_buffer]
        lens = [buf.nbytes for buf in self.kv_buffer]
        items = [buf[0].nbytes * self.page_size for buf in self.kv_buffer]
        return ptrs, lens, items


class ReferenceDeepSeekV4SingleKVPool(_ReferenceKVCache):
    """SGLang 0.5.23 ``DeepSeekV4SingleKVPool`` with the V4 layout, in pure torch.

    ``kv_buffer[i]`` is a zeroed ``uint8`` tensor ``[num_pages, page_bytes]``:
    584 bytes per token (448 e4m3 + 64 bf16 + 7 scale bytes + 1 pad), pages
    padded to a multiple of 576 bytes (37440 bytes at ``page_size=64``), and
    ``ceil((size + global_page_size) / page_size)`` pages. ``get_key_buffer``
    returns the fp8-typed view; ``get_value_buffer``/``get_kv_buffer`` raise
    ``NotImplementedError("Use get_key_buffer instead.")`` and ``set_kv_buffer``
    a bare ``NotImplementedError()``, exactly like SGLang.

    Example:
        >>> from kvcompat.testing import ReferenceDeepSeekV4SingleKVPool
        >>> pool = ReferenceDeepSeekV4SingleKVPool(size=64, page_size=64)
        >>> pool.kv_buffer[0].shape, pool.get_key_buffer(0).dtype
        (torch.Size([2, 37440]), torch.float8_e4m3fn)
        >>> pool.get_kv_buffer(0)
        Traceback (most recent call last):
        ...
        NotImplementedError: Use get_key_buffer instead.
    """

    kv_layout: KVLayout = KVLayout.V4

    def __init__(
        self,
        size: int,
        page_size: int,
        dtype: torch.dtype = torch.float8_e4m3fn,
        qk_nope_head_dim: int = 448,
        qk_rope_head_dim: int = 64,
        layer_num: int = 1,
        device: str = "cpu",
        enable_memory_saver: bool = False,
        start_layer: int | None = None,
        end_layer: int | None = None,
        kv_layout: str | KVLayout = KVLayout.V4,
        global_page_size: int | None = None,
    ) -> None:
        _reject_unmodelled(
            "ReferenceDeepSeekV4SingleKVPool", enable_memory_saver=enable_memory_saver
        )
        super().__init__(size, page_size, dtype, layer_num, device, start_layer, end_layer)
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.global_page_size = global_page_size or page_size
        self.kv_layout = KVLayout(getattr(kv_layout, "value", kv_layout))
        if self.kv_layout is not KVLayout.V4:
            msg = (
                f"ReferenceDeepSeekV4SingleKVPool models the V4 layout only, got "
                f"kv_layout={self.kv_layout.value!r}.\n"
                "Hint: use SGLang's own DeepSeekV4SingleKVPool for the V4.1 layouts."
            )
            raise NotImplementedError(msg)
        self.scale_pad = 1
        self.quantize_block_size = 64
        self.rope_storage_dtype = torch.bfloat16
        self.k_with_scale_buffer_dtype = torch.int8
        num_pages = math.ceil((size + self.global_page_size) / page_size)
        self.kv_buffer = [self.create_buffer(num_pages=num_pages) for _ in range(layer_num)]

    def get_bytes_per_token(self) -> int:
        """448 e4m3 + 64 bf16 + one scale per 64 nope values + 1 pad byte."""
        return (
            self.qk_nope_head_dim
            + self.qk_rope_head_dim * self.rope_storage_dtype.itemsize
            + self.qk_nope_head_dim // self.quantize_block_size
            + self.scale_pad
        )

    def create_buffer(self, *, num_pages: int) -> torch.Tensor:
        """A zeroed page-major buffer, with SGLang's geometry checks."""
        bytes_per_token = self.get_bytes_per_token()
        self.kv_cache_total_dim = bytes_per_token
        self.bytes_per_page_padded = math.ceil(self.page_size * bytes_per_token / 576) * 576
        if bytes_per_token != 448 + 64 * 2 + 8:
            msg = (
                "DSV4 KV layout: qk_nope_head_dim FP8 (448) + qk_rope_head_dim BF16 "
                "(64*2) + nope FP8 scales + scale_pad = 584 bytes/token"
            )
            raise AssertionError(msg)
        if self.store_dtype != torch.uint8:
            raise AssertionError
        return torch.zeros(
            num_pages, self.bytes_per_page_padded, dtype=self.store_dtype, device=self.device
        )

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """SGLang's two branches: fp8 view at ``layer_id - start_layer``, else ``[layer_id]``."""
        if self.store_dtype != self.dtype:
            return self.kv_buffer[layer_id - self.start_layer].view(self.dtype)
        return self.kv_buffer[layer_id]

    def set_kv_buffer(self, *args: Any, **kwargs: Any) -> None:
        """Raises a bare ``NotImplementedError()``, as SGLang does."""
        raise NotImplementedError

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """Raises ``NotImplementedError("Use get_key_buffer instead.")``."""
        msg = "Use get_key_buffer instead."
        raise NotImplementedError(msg)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Raises ``NotImplementedError("Use get_key_buffer instead.")``."""
        msg = "Use get_key_buffer instead."
        raise NotImplementedError(msg)


class ReferenceSWAKVPool:
    """SGLang 0.5.23 ``SWAKVPool``: full-attention and sliding-window MHA sub-pools.

    ``layers_mapping[global_id] = (dense_index, is_swa)`` routes each layer; the
    getters wait with the global id and forward the dense index to a sub-pool.
    As in SGLang, ``swa_head_num``/``swa_head_dim``/``swa_v_head_dim`` reach only
    the sliding-window sub-pool, and any other keyword (``start_layer`` too)
    reaches both.

    Example:
        >>> from kvcompat.testing import ReferenceSWAKVPool
        >>> pool = ReferenceSWAKVPool(
        ...     size=64, size_swa=32, page_size=16, dtype=None, head_num=2, head_dim=8,
        ...     swa_attention_layer_ids=[0, 2], full_attention_layer_ids=[1, 3], device="cpu",
        ... )
        >>> pool.layers_mapping[2], pool.get_key_buffer(2).shape
        ((1, True), torch.Size([48, 2, 8]))
    """

    _SWA_ONLY = ("swa_head_num", "swa_head_dim", "swa_v_head_dim")

    def __init__(
        self,
        size: int,
        size_swa: int,
        page_size: int,
        dtype: torch.dtype | None,
        head_num: int,
        head_dim: int,
        swa_attention_layer_ids: Sequence[int],
        full_attention_layer_ids: Sequence[int],
        device: str,
        token_to_kv_pool_class: type = ReferenceMHATokenToKVPool,
        enable_memory_saver: bool = False,
        **kwargs: Any,
    ) -> None:
        dtype = dtype or torch.bfloat16
        self.size = size
        self.size_swa = size_swa
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.device = device
        self.page_size = page_size
        self.start_layer = 0
        self.layer_transfer_counter: Any = None
        self.swa_layer_nums = len(swa_attention_layer_ids)
        self.full_layer_nums = len(full_attention_layer_ids)
        self.layer_num = self.swa_layer_nums + self.full_layer_nums
        common = {
            "page_size": page_size,
            "enable_memory_saver": enable_memory_saver,
            "device": device,
            "head_num": head_num,
            "head_dim": head_dim,
        }
        full_kwargs = {**common, "allocation_label": "Full", **kwargs}
        for name in self._SWA_ONLY:
            full_kwargs.pop(name, None)
        swa_kwargs = {**common, "allocation_label": "SWA", **kwargs}
        self.full_kv_pool = token_to_kv_pool_class(
            size=size, dtype=dtype, layer_num=self.full_layer_nums, **full_kwargs
        )
        self.swa_kv_pool = token_to_kv_pool_class(
            size=size_swa, dtype=dtype, layer_num=self.swa_layer_nums, **swa_kwargs
        )
        for pool, layer_ids in (
            (self.full_kv_pool, full_attention_layer_ids),
            (self.swa_kv_pool, swa_attention_layer_ids),
        ):
            if isinstance(pool, ReferenceMHATokenToKVPool):
                pool.model_layer_ids = tuple(layer_ids)
        self.layers_mapping: dict[int, tuple[int, bool]] = {}
        for dense, layer in enumerate(full_attention_layer_ids):
            self.layers_mapping[layer] = (dense, False)
        for dense, layer in enumerate(swa_attention_layer_ids):
            self.layers_mapping[layer] = (dense, True)
        self.full_to_swa_index_mapping: torch.Tensor | None = None
        k_size, v_size = self.get_kv_size_bytes()
        self.mem_usage = (k_size + v_size) / (1 << 30)

    def register_mapping(self, full_to_swa_index_mapping: torch.Tensor) -> None:
        """Install the full-pool -> SWA-pool token index mapping."""
        self.full_to_swa_index_mapping = full_to_swa_index_mapping

    def register_layer_transfer_counter(self, layer_transfer_counter: Any) -> None:
        """The wrapper waits; the sub-pools never do."""
        self.layer_transfer_counter = layer_transfer_counter
        self.full_kv_pool.register_layer_transfer_counter(None)
        self.swa_kv_pool.register_layer_transfer_counter(None)

    def get_kv_size_bytes(self) -> tuple[int, int]:
        """K and V bytes summed over both sub-pools."""
        k_full, v_full = self.full_kv_pool.get_kv_size_bytes()
        k_swa, v_swa = self.swa_kv_pool.get_kv_size_bytes()
        return k_full + k_swa, v_full + v_swa

    def get_v_head_dim(self) -> int:
        """The full side's value head dim (the SWA side's when there is no full side)."""
        lead = self.full_kv_pool if self.full_layer_nums > 0 else self.swa_kv_pool
        return int(lead.get_value_buffer(lead.start_layer).shape[-1])

    def _route(self, layer_id: int) -> tuple[Any, int]:
        if self.layer_transfer_counter is not None:
            self.layer_transfer_counter.wait_until(layer_id - self.start_layer)
        dense, is_swa = self.layers_mapping[layer_id]
        return (self.swa_kv_pool if is_swa else self.full_kv_pool), dense

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        """The sub-pool's key buffer at the dense index."""
        pool, dense = self._route(layer_id)
        key: torch.Tensor = pool.get_key_buffer(dense)
        return key

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        """The sub-pool's value buffer at the dense index."""
        pool, dense = self._route(layer_id)
        value: torch.Tensor = pool.get_value_buffer(dense)
        return value

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The sub-pool's ``(key, value)`` at the dense index."""
        pool, dense = self._route(layer_id)
        pair: tuple[torch.Tensor, torch.Tensor] = pool.get_kv_buffer(dense)
        return pair

    def set_kv_buffer(
        self,
        layer: Any,
        loc_info: Any,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """Write through the sub-pool; SWA layers need ``loc_info.swa_loc``, as in SGLang."""
        loc = getattr(loc_info, "loc", loc_info)
        swa_loc = getattr(loc_info, "swa_loc", None)
        dense, is_swa = self.layers_mapping[int(layer.layer_id)]
        pool = self.swa_kv_pool if is_swa else self.full_kv_pool
        if is_swa:
            if swa_loc is None:
                raise AssertionError
            loc = swa_loc
        pool.set_kv_buffer(None, loc, cache_k, cache_v, layer_id_override=dense)


def reference_swa_pool(**overrides: Any) -> ReferenceSWAKVPool:
    """A small :class:`ReferenceSWAKVPool`: SWA layers 0 and 2, full layers 1 and 3.

    Example:
        >>> from kvcompat.testing import reference_swa_pool
        >>> reference_swa_pool().layers_mapping
        {1: (0, False), 3: (1, False), 0: (0, True), 2: (1, True)}
    """
    kwargs: dict[str, Any] = {
        "size": 64,
        "size_swa": 32,
        "page_size": 16,
        "dtype": torch.bfloat16,
        "head_num": 2,
        "head_dim": 8,
        "swa_attention_layer_ids": [0, 2],
        "full_attention_layer_ids": [1, 3],
        "device": "cpu",
    }
    kwargs.update(overrides)
    return ReferenceSWAKVPool(**kwargs)


def _reject_unmodelled(owner: str, **options: Any) -> None:
    """Refuse SGLang options the reference pools do not model (instead of ignoring them)."""
    used = {name: value for name, value in options.items() if value}
    if used:
        msg = (
            f"{owner} does not model {', '.join(f'{k}={v!r}' for k, v in used.items())}.\n"
            "Hint: use SGLang's own class for these options; the reference pools cover the "
            "default configuration."
        )
        raise NotImplementedError(msg)


for _cls, _kind, _leaf in (
    (ReferenceMHATokenToKVPool, PoolKind.SPLIT, SplitAdapter),
    (ReferenceMLATokenToKVPool, PoolKind.LATENT, LatentAdapter),
    (ReferenceDeepSeekV4SingleKVPool, PoolKind.SINGLE_KV, SingleKVAdapter),
):
    _install(Family(qualified_name(_cls), _kind, leaf=_leaf))
_install(
    Family(qualified_name(ReferenceSWAKVPool), PoolKind.COMPOSITE, build=adapt_swa, parts=SWA_PARTS)
)

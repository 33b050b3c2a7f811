"""The engine process's configuration: one dataclass, validated, mapped from the command line."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from engine.admission import AdmissionConfig
from engine.core import CoreConfig
from engine.llm.kernels import check_kernel
from engine.llm.scheduler import LIGHT_SLACK_S, check_token_buckets

__all__ = ["EngineConfig"]



@dataclass(frozen=True)
class EngineConfig:
    # A name, hub id or local checkpoint that models.registry resolves to a program: "hibari"
    # (embedded CPU voice), "synthetic" (tones paced at real time, for tests and benchmarks),
    # "orpheus" (canopylabs/orpheus-3b-0.1-ft), ...
    model: str = "hibari"
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    load_format: str = "auto"  # "auto" | "dummy" (random weights from the known config)
    dtype: str = "auto"  # "auto" (bf16 on CUDA, fp32 on CPU) | "bfloat16" | "float32"
    codec_path: str | None = None  # local SNAC dir or hub id; default hubertsiuzdak/snac_24khz
    # A LoRA adapter (a file or a folder in the reference's format) folded into the weights once
    # at load: one adapted model per engine (VoxCPM2: models/voxcpm2/lora.py).
    lora: str | None = None
    # A program's own load-time settings by name (``voxgate serve --model-setting NAME=VALUE``,
    # the value as given, converted to the type of the setting's default at load): the settings
    # a model's doc lists (docs/models/voxcpm2.md, "Load-time settings"); a name the model does
    # not read stops the engine at start-up with the names it does.
    model_settings: tuple[tuple[str, str], ...] = ()
    # Where the model's codec runs when it is not the LM's device ("cuda:1": the LM on cuda:0, the
    # codec on the second GPU; "cpu"). None: the LM's device. Only a program that can place its
    # codec elsewhere takes it (Orpheus); others refuse it at start-up (docs/deploy.md).
    codec_device: str | None = None
    gpu_memory_utilization: float = 0.85
    # Engines sharing this GPU (voxgate serve --gpus 0 --engines 2): each sizes its KV cache to
    # its own gpu_memory_utilization / gpu_memory_share of the GPU, counting only its own
    # memory (engine.llm.model_runner.kv_budget_bytes). 1: the engine has the GPU to itself.
    gpu_memory_share: int = 1
    # Jobs (segments) generating at once; a stream holds two, its spoken segment and the one
    # generated ahead (CoreConfig.lookahead_jobs), so 1024 serves 512 streams without a segment
    # waiting for a slot.
    max_num_seqs: int = 1024
    # Decode rows per step: -1 = auto (the program's ServingDefaults on CUDA: Orpheus 512 under
    # the cap its step times allow (AdmissionConfig.decode_cap_budget), 448 with fp8 weights
    # (docs/performance_history.md, run 28; models.orpheus.build); no cap on the CPU), 0 = no cap.
    max_num_decode_seqs: int = -1
    # Decode only the jobs whose audio is due within this many seconds, filling the step up to
    # decode_fill_seqs rows with the next deadlines (engine.llm.scheduler): -1 = auto (1.0 s and
    # 256 rows on CUDA, off on the CPU), 0 = off / no fill.
    decode_horizon_s: float = -1.0
    decode_fill_seqs: int = -1
    # Under load (a step of at least decode_fill_seqs decode rows) fresh prompts wait up to
    # prefill_wait_s, once due, for prefill_batch_seqs of them to share one prefill pass
    # (engine.llm.scheduler): -1 = auto (the program's with CUDA graphs, Orpheus 100 ms and 16;
    # off otherwise and with mixed graphs, where a prompt rides in the decode rows' pass), 0 = off.
    prefill_wait_s: float = -1.0
    prefill_batch_seqs: int = -1
    # Under load, prompts not due within the decode horizon (segments generated ahead) wait
    # (engine.llm.scheduler hold_undue_prompts): "on" / "off" (default: not measured on a GPU).
    hold_undue_prompts: str = "off"
    # Light steps (engine.llm.scheduler light_steps_max): a new sequence's first steps, which a
    # head runs in a cheaper variant (TokenHead.light_until_step: Kyutai TTS), take up to this
    # many steps in a row of their own while the other due rows can wait: -1 = auto (the
    # program's default on CUDA: Kyutai TTS 4, measured on two H200s; others 0), 0 = off.
    light_steps: int = -1
    # Light steps run while no playing stream's row is due within this many seconds
    # (engine.llm.scheduler LIGHT_SLACK_S: 0.05, measured against 0.1 on two H200s).
    light_slack_s: float = LIGHT_SLACK_S
    # The runtime sampler's draw (engine.llm.sampler Sampler.kernel): "torch", "triton" (one
    # kernel a sample for vocabularies up to 8,192 columns on CUDA: engine.llm.sample_triton), or
    # "auto" = the program's default on CUDA where Triton imports (Qwen3-TTS triton, measured on
    # two H200s; others torch), torch elsewhere.
    sampler_kernel: str = "auto"
    # Launch each LM step before the previous one's tokens reach the host (engine.llm.backend
    # LMBackend.step), so the device does not wait for the host between steps: "auto" = on
    # with CUDA graphs (measured on an H200: 224 streams on time, 192 without), "on", "off".
    async_steps: str = "auto"
    # A step with decode rows and fresh prompts replays one CUDA graph for both (one pass over
    # the weights, engine.llm.mixed_graphs) instead of a decode graph and a prefill graph:
    # "on" / "off" (default: on an H200 the engine's steps with prompts were 3-4 ms shorter,
    # but no more streams were on time when served; docs/performance_history.md, runs 14-15; with fp8
    # weights at a cap of 512, fewer: run 27).
    mixed_graphs: str = "off"
    # The decode graphs' attention plans send the page ids to the device without waiting for
    # the step in flight (engine.llm.flashinfer_attention.GraphDecodeAttention): "on" / "off".
    # With it off, FlashInfer's plan waits for the device before each step's launch (36% of the
    # engine's time at 64 streams on the H200). On (default): engine steps 2-7% shorter, and 384
    # streams over a 3 s ramp 99.9% on time against 98.6% off (docs/performance_history.md, run 24).
    async_plan: str = "on"
    # The decode attention in the CUDA graphs: FlashInfer's "cuda-cores" (its decode kernel)
    # or "tensor-cores" (its prefill kernel). On an H200 (benchmark.gpu.decode_attention, run 27)
    # tensor cores were slower at the contexts served segments hold (128 and 256 tokens: 12-59%
    # longer with bf16 pages) and faster only at 512 (6-15% shorter). "triton": one Triton kernel
    # of the runtime's own, no plan (engine.llm.decode_attention_triton). "auto" (default): the
    # model's choice on CUDA where Triton imports (its ServingDefaults; Orpheus: triton, with
    # its other Triton kernels served on an H200, docs/performance.md), else cuda-cores.
    decode_attention: str = "auto"
    # The prefill graphs' token counts (engine.llm.prefill_graphs): a step's fresh prompts run in
    # the smallest that holds them, padded. () = the model's (its program's ServingDefaults),
    # else the runner's 32, 64, 128, 256, 512 (those up to max_model_len). Finer steps pad less
    # (three ~55-token prompts pad 165 tokens to 256) for a few more graphs to capture (served
    # on two H100s with the measured cap and batches of 16: docs/performance.md, "The serving
    # settings on an H100").
    prefill_token_buckets: tuple[int, ...] = ()
    # How a step's keys and values are stored into the KV cache (engine.llm.attention.write_kv):
    # "index" (two index_put kernels a layer) or "triton" (one kernel a layer on CUDA,
    # engine.llm.kv_write_triton; timed only beside the other Triton kernels; fp8 caches keep
    # index_put). "auto" (default): the model's choice on CUDA where Triton imports, else index.
    kv_write: str = "auto"
    # Orpheus fast-start ramp: lookahead growth per frame in samples (models.orpheus.codec
    # StreamingDecoder). 1024 releases 1,024 samples in each of frames 1-4; 1536 releases 1024,
    # 512, 512, 1387 (a start buffer fills a frame later, with less of a deficit behind it).
    # 0 = auto: 1024, and 1536 for segments that start while frames take over 35 ms (on CUDA;
    # 1024 always on the CPU).
    ramp_step_samples: int = 0
    # Prompt and audio tokens a segment's row holds (its KV pages). -1 = auto: 2048, or the
    # model's positions where it has fewer (engine.llm.program.model_len, as vLLM takes the
    # model's own length); a value the model cannot hold is the model's to refuse at start-up.
    max_model_len: int = -1
    enable_cuda_graphs: bool = True
    # fp8 options (CUDA only, bf16 models; engine.llm.fp8): "fp8" stores the KV pages as
    # float8_e4m3fn (half the bytes per page), resp. the decoder layers' linear weights as fp8
    # with per-channel scales (row-wise fp8 GEMMs). Off by default.
    kv_cache_dtype: str = "auto"  # "auto" (the model's dtype) | "fp8"
    quantization: str = "none"  # "none" | "fp8"
    synthetic_realtime: bool = True  # synthetic model: pace chunks at real time
    synthetic_cloning: bool = False  # synthetic model: accept registered voices (tests)
    hibari_threads: int = 1
    core: CoreConfig = field(default_factory=CoreConfig)
    # Admission of streams by the capacity measured from the engine's step times: a stream past
    # it waits in a bounded queue or is refused with a retryable `capacity` error
    # (engine.admission, docs/scheduling.md).
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    queue_capacity_bytes: int = 32 * 1024 * 1024
    max_message_bytes: int = 4 * 1024 * 1024
    stats_interval_s: float = 1.0

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must be a name, a path or a hub id")
        from models.registry import check_requirements, resolve

        resolved = resolve(self.model)  # an unknown name lists what is served
        check_requirements(resolved)  # a missing package names the extra to install
        if self.device == "cuda" and resolved.is_cpu_only:
            why = "" if resolved.entry.device == "cpu" else " (a tiny test model: FlashInfer takes no head size of 16)"
            raise ValueError(f"--device cuda does not apply to --model {self.model}: it runs on the CPU only{why}")
        if self.device == "auto" and resolved.model_id in resolved.entry.cpu_ids:  # a tiny test model
            object.__setattr__(self, "device", "cpu")  # (where it runs, said wherever the device is)
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if self.load_format not in ("auto", "dummy"):
            raise ValueError(f"load_format must be auto or dummy, got {self.load_format!r}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, got {self.dtype!r}")
        if self.kv_cache_dtype not in ("auto", "fp8"):
            raise ValueError(f"kv_cache_dtype must be auto or fp8, got {self.kv_cache_dtype!r}")
        if self.quantization not in ("none", "fp8"):
            raise ValueError(f"quantization must be none or fp8, got {self.quantization!r}")
        fp8 = [n for n, v in (("--kv-cache-dtype fp8", self.kv_cache_dtype),
                              ("--quantization fp8", self.quantization)) if v == "fp8"]
        if fp8 and self.device == "cpu":
            raise ValueError(f"{' and '.join(fp8)} require{'s' * (len(fp8) == 1)} a CUDA GPU (device is cpu)")
        if fp8 and self.dtype not in ("auto", "bfloat16"):
            raise ValueError(f"{' and '.join(fp8)} require{'s' * (len(fp8) == 1)} dtype bfloat16 (or auto), "
                             f"got {self.dtype!r}")
        if self.codec_device is not None:
            if not re.fullmatch(r"cpu|cuda(:\d+)?", self.codec_device):
                raise ValueError(f"codec_device must be cpu, cuda or cuda:N, got {self.codec_device!r}")
            if self.device == "cpu" and self.codec_device != "cpu":
                raise ValueError(f"--codec-device {self.codec_device} needs the LM on a GPU (device is cpu)")
        if not 0.05 <= self.gpu_memory_utilization <= 0.99:
            raise ValueError("gpu_memory_utilization must be in [0.05, 0.99]")
        if not 1 <= self.gpu_memory_share <= 64:
            raise ValueError(f"gpu_memory_share must be in [1, 64] (engines on one GPU), got "
                             f"{self.gpu_memory_share}")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_decode_seqs < -1:
            raise ValueError("max_num_decode_seqs must be -1 (auto), 0 (no cap) or a row count")
        if not (self.decode_horizon_s == -1.0 or self.decode_horizon_s >= 0.0):
            raise ValueError("decode_horizon_s must be -1 (auto), 0 (off) or seconds")
        if self.decode_fill_seqs < -1:
            raise ValueError("decode_fill_seqs must be -1 (auto), 0 or a row count")
        if not (self.prefill_wait_s == -1.0 or self.prefill_wait_s >= 0.0):
            raise ValueError("prefill_wait_s must be -1 (auto), 0 (off) or seconds")
        if self.async_steps not in ("auto", "on", "off"):
            raise ValueError("async_steps must be auto, on or off")
        if self.mixed_graphs not in ("on", "off"):
            raise ValueError("mixed_graphs must be on or off")
        if self.async_plan not in ("on", "off"):
            raise ValueError("async_plan must be on or off")
        check_kernel("decode_attention", self.decode_attention)
        check_token_buckets(self.prefill_token_buckets)
        check_kernel("kv_write", self.kv_write)
        if self.hold_undue_prompts not in ("on", "off"):
            raise ValueError("hold_undue_prompts must be on or off")
        if self.sampler_kernel not in ("auto", "torch", "triton"):
            raise ValueError("sampler_kernel must be auto, torch or triton")
        if self.light_steps < -1:
            raise ValueError("light_steps must be -1 (auto), 0 (off) or a step count")
        if not (math.isfinite(self.light_slack_s) and self.light_slack_s >= 0.0):
            raise ValueError(f"light_slack_s must be >= 0 seconds, got {self.light_slack_s}")
        if self.prefill_batch_seqs < -1:
            raise ValueError("prefill_batch_seqs must be -1 (auto), 0 or a prompt count")
        if not 0 <= self.ramp_step_samples <= 8192:
            raise ValueError("ramp_step_samples must be 0 (auto) or in [1, 8192]")
        if self.max_model_len != -1 and self.max_model_len < 64:
            raise ValueError("max_model_len must be -1 (auto) or >= 64")
        if self.hibari_threads < 1:
            raise ValueError("hibari_threads must be >= 1")
        if self.max_message_bytes * 2 > self.queue_capacity_bytes:
            raise ValueError("queue_capacity_bytes must be at least twice max_message_bytes")
        if self.stats_interval_s <= 0:
            raise ValueError("stats_interval_s must be > 0")

"""Whether a training run compiles its model: compile=auto|true|false, never a silent fallback.

python train.py compile=true            (compile on the CPU too; needs a C++ compiler)
auto compiles on CUDA. On the CPU it trains eagerly: measured with bench/cpu_bench.py on the 2-core machine
(bench/RESULTS.md), the compiled step of the tiny model was 0.86x to 1.06x the eager one in two runs (no gain
outside the noise, since model/fused.py and model/head.py already make the eager step about as fast as a plain
GPT-2 block) and compiling costs 5 s (warm inductor cache) to 26 s (cold) first; the small model compiled ran
1.04x eager after 33 s of compiling (about 220 steps to pay back, if that 4% is more than noise). No break-even
outside the noise could be established. Where that changes (another CPU, a larger model), pass compile=true.
"""

import shutil

import torch

from utils.errors import UserError


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use on the CPU, or None."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        return get_cpp_compiler()
    except Exception:  # inductor raises its own error types when none is found
        return shutil.which("g++") or shutil.which("clang++")


def should_compile(setting, device: torch.device, say=print) -> bool:
    if setting is False:
        return False
    if device.type == "cuda":
        return True
    if setting is True:
        if cxx_compiler() is None:
            raise UserError(
                "compile=true on the CPU needs a C++ compiler and none was found; install one (apt-get install g++, "
                "or set CXX) or pass compile=false"
            )
        return True
    say("compile=auto: eager on the CPU, where compiling measured no gain (bench/RESULTS.md); compile=true forces it")
    return False

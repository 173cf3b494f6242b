"""What the GPU op tests need: torch, a CUDA GPU and a build of tileweave with its GPU ops. A test
module imports torch and tileweave from here; where one is missing, the import skips the whole
module with the reason (pytest.skip at module level propagates through this import)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: the GPU op tests need it")
import tileweave  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch: GPU op tests skipped", allow_module_level=True)
if not tileweave.has_cuda:
    pytest.skip("tileweave was built without CUDA (TILEWEAVE_CUDA=1 pip install . builds the GPU ops)",
                allow_module_level=True)

"""One lock for every import from diffusers and transformers in this process.

Their lazy modules are not safe to import from two threads at once: with torch imported, a
`from diffusers import Cosmos3AVAEAudioTokenizer` started 0-2 s after another thread's `from diffusers import
AutoencoderKLWan` raised ImportError in 5 runs out of 5 (diffusers 0.42, Python 3.11), and a first job's
`from diffusers import FlowMatchEulerDiscreteScheduler` beside a background VAE build did the same. So did the
text tokenizer's `from transformers import AutoTokenizer` beside it under CI's load: diffusers' VAE module imports
`transformers.PreTrainedModel` lazily ("cannot import name 'PreTrainedModel' from 'transformers'"). A render
worker's text tokenizer loads, and its VAE and sound tokenizer build, in threads (cosmos3.background_build), so
every such import of cosmos3 holds this lock.
"""

from __future__ import annotations

import threading

LIBRARY_IMPORT = threading.Lock()

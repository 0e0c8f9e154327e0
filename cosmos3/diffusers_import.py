"""One lock for every import from diffusers in this process.

diffusers' lazy modules are not safe to import from two threads at once: with torch imported, a
`from diffusers import Cosmos3AVAEAudioTokenizer` started 0-2 s after another thread's `from diffusers import
AutoencoderKLWan` raised ImportError in 5 runs out of 5 (diffusers 0.42, Python 3.11), and a first job's
`from diffusers import FlowMatchEulerDiscreteScheduler` beside a background VAE build did the same. A render
worker's VAE builds in a thread (cosmos3.vae.VAEBuild), so every diffusers import of cosmos3 holds this lock.
"""

from __future__ import annotations

import threading

DIFFUSERS_IMPORT = threading.Lock()

"""Conditioning media in, frames out: loading, resize-to-cover + centre crop, uint8 conversion.

Pixels travel as ``uint8 [T, H, W, 3]`` numpy arrays at the edges and as ``float32 [3, T, H, W]``
tensors in ``[-1, 1]`` towards the VAE (the layout ``AutoencoderKLWan`` takes, minus the batch axis).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from cosmos3.errors import PipelineError


def _as_uint8_rgb(array, field: str, ndim: int) -> np.ndarray:
    """``array`` as ``uint8 [..., 3]``; floats are read as ``[0, 1]``, alpha is dropped, grey is repeated."""
    array = np.asarray(array)
    if array.ndim == ndim - 1:  # greyscale: no channel axis
        array = np.repeat(array[..., None], 3, axis=-1)
    if array.ndim != ndim or array.shape[-1] not in (3, 4):
        want = "[H, W, 3]" if ndim == 3 else "[T, H, W, 3]"
        raise PipelineError(f"{field}: expected an RGB array shaped {want}, got shape {tuple(array.shape)}")
    array = array[..., :3]
    if array.dtype == np.uint8:
        return array
    if np.issubdtype(array.dtype, np.floating):
        if array.size and (array.min() < 0.0 or array.max() > 1.0):
            raise PipelineError(
                f"{field}: float pixels must lie in [0, 1], got [{array.min():.3g}, {array.max():.3g}] "
                "(pass uint8 0..255 or scale to [0, 1])"
            )
        return np.round(array * 255.0).astype(np.uint8)
    raise PipelineError(f"{field}: pixels must be uint8 or float in [0, 1], got dtype {array.dtype}")


def _existing_file(source, field: str) -> Path:
    path = Path(source)
    if not path.is_file():
        raise PipelineError(f"{field}: no file at {path}")
    return path


def load_image(source) -> np.ndarray:
    """A path or an array -> ``uint8 [H, W, 3]``."""
    if isinstance(source, (str, Path)):
        from PIL import Image

        path = _existing_file(source, "image")
        try:
            with Image.open(path) as image:
                source = np.asarray(image.convert("RGB"))
        except OSError as err:
            raise PipelineError(f"image: cannot read {path} as an image ({err})") from None
    return _as_uint8_rgb(source, "image", ndim=3)


def load_video(source) -> np.ndarray:
    """A path (any container imageio reads) or an array -> ``uint8 [T, H, W, 3]``."""
    if isinstance(source, (str, Path)):
        import imageio.v3 as iio

        path = _existing_file(source, "video")
        try:
            source = iio.imread(path)
        except (OSError, ValueError, RuntimeError) as err:
            raise PipelineError(f"video: cannot read {path} as a video ({err})") from None
    frames = _as_uint8_rgb(source, "video", ndim=4)
    if frames.shape[0] == 0:
        raise PipelineError("video: the input video has no frames")
    return frames


def resize_cover_crop(frames: np.ndarray, height: int, width: int) -> torch.Tensor:
    """``uint8 [T, h, w, 3]`` -> ``float32 [3, T, height, width]`` in ``[-1, 1]``.

    Aspect-preserving resize so the frame covers the target (bilinear, antialiased), centre crop,
    then rounding to whole uint8 levels, as the published pipeline preprocesses its conditioning.
    """
    # numpy's copy to float32 also serves read-only frames (an image read through PIL): torch warns on those
    video = torch.from_numpy(np.ascontiguousarray(frames, dtype=np.float32)).permute(0, 3, 1, 2)  # [T, 3, h, w]
    src_h, src_w = video.shape[-2:]
    if (src_h, src_w) != (height, width):
        scale = max(height / src_h, width / src_w)
        size = (math.ceil(scale * src_h), math.ceil(scale * src_w))
        video = F.interpolate(video, size=size, mode="bilinear", align_corners=False, antialias=True)
        top = round((size[0] - height) / 2)
        left = round((size[1] - width) / 2)
        video = video[:, :, top : top + height, left : left + width]
    video = video.round().clamp(0, 255) / 127.5 - 1.0
    return video.permute(1, 0, 2, 3).contiguous()  # [3, T, H, W]


def host_frames(shape: tuple[int, int, int, int], device: torch.device) -> np.ndarray:
    """An empty ``uint8 [T, H, W, 3]`` for frames decoded on ``device``: in pinned memory from a GPU (see
    ``to_uint8_frames``), so each chunk's copy into it is as fast as the whole clip's was."""
    return torch.empty(shape, dtype=torch.uint8, pin_memory=device.type == "cuda").numpy()


def to_uint8_frames(video: torch.Tensor, out: np.ndarray | None = None) -> np.ndarray:
    """Decoded ``[3, T, H, W]`` in ``[-1, 1]`` -> C-contiguous ``uint8 [T, H, W, 3]``, the layout ffmpeg's pipe and
    the PNG writer read; into ``out`` (that shape, e.g. a slice of ``host_frames``'s) where given.

    The channel-last transpose runs where the video is: a transposed view handed to the host left the encoder
    a strided gather of a Nano clip's 522 MB, 1.8 s on the H200's host. From a GPU the frames come through pinned
    memory (torch's cached host blocks): 0.018 s instead of 0.42 s for a pageable copy there
    (benchmarks/results/h200-render.md).
    """
    levels = video.to(torch.float32, copy=True).div_(2).add_(0.5).clamp_(0, 1).mul_(255).round_()
    frames = levels.to(torch.uint8).permute(1, 2, 3, 0).contiguous()  # [T, H, W, 3]
    if out is None:
        if frames.device.type != "cuda":
            return frames.numpy()
        out = host_frames(tuple(frames.shape), frames.device)
    if out.shape != tuple(frames.shape):
        raise ValueError(f"out is {list(out.shape)}, the frames {list(frames.shape)}")
    torch.from_numpy(out).copy_(frames)
    return out

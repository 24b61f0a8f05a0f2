"""The zoo's torchvision and timm rows: image classifiers built with small widths (random weights, no download).

Images of 32x32, batches of 4, 10 classes; dropout and stochastic depth off so that eager and ORT do the same
arithmetic. ``Expect`` in each row is the outcome on this branch today (the one place to tighten).

These rows need torchvision and timm, which load only where torchvision's C++ ops match torch's build
(the torch-2.14 run: ``bash scripts/test_torch.sh 2.14.1``); the main suite does not collect this folder.
"""

from __future__ import annotations

import lightning as L
import timm
import torch
import torch.nn.functional as F
from timm.models import beit as timm_beit
from timm.models import convnext as timm_convnext
from timm.models import efficientnet as timm_efficientnet
from timm.models import maxxvit as timm_maxxvit
from timm.models import metaformer as timm_metaformer
from timm.models import mlp_mixer as timm_mlp_mixer
from timm.models import mobilenetv3 as timm_mobilenetv3
from timm.models import nfnet as timm_nfnet
from timm.models import pvt_v2 as timm_pvt_v2
from timm.models import regnet as timm_regnet
from timm.models import resnet as timm_resnet
from timm.models import vision_transformer as timm_vit
from torch import Tensor, nn
from torchvision.models import convnext, densenet, efficientnet, mobilenetv3, regnet, resnet, shufflenetv2
from torchvision.models import maxvit as tv_maxvit
from torchvision.models import swin_transformer as tv_swin
from torchvision.models import vision_transformer as tv_vit
from zoo_harness import Expect, ZooModel

IMAGE = 32
BATCH = 8
LR = 0.01  # BatchNorm networks at random init: a larger step makes the loss jump (and chaotic)
CLASSES = 10

ALL = Expect("all")


def image_batch(generator: torch.Generator) -> tuple[Tensor, Tensor]:
    images = torch.randn(BATCH, 3, IMAGE, IMAGE, generator=generator)
    return images, torch.randint(0, CLASSES, (BATCH,), generator=generator)


def classifier_loss(module: L.LightningModule, batch: tuple[Tensor, Tensor]) -> Tensor:
    images, labels = batch
    return F.cross_entropy(module(images), labels)


def tv_resnet() -> nn.Module:
    return resnet.ResNet(resnet.BasicBlock, [1, 1, 1, 1], num_classes=CLASSES)


def tv_mobilenet_v3() -> nn.Module:
    return mobilenetv3.mobilenet_v3_small(width_mult=0.25, dropout=0.0, num_classes=CLASSES)


def tv_efficientnet() -> nn.Module:
    setting, last_channel = efficientnet._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return efficientnet.EfficientNet(
        setting, dropout=0.0, stochastic_depth_prob=0.0, num_classes=CLASSES, last_channel=last_channel
    )


def tv_convnext() -> nn.Module:
    blocks = [convnext.CNBlockConfig(16, 32, 1), convnext.CNBlockConfig(32, 64, 1), convnext.CNBlockConfig(64, None, 1)]
    return convnext.ConvNeXt(blocks, stochastic_depth_prob=0.0, num_classes=CLASSES)


def tv_regnet() -> nn.Module:
    params = regnet.BlockParams.from_init_params(depth=4, w_0=16, w_a=8.0, w_m=2.0, group_width=8)
    return regnet.RegNet(params, num_classes=CLASSES)


def tv_densenet() -> nn.Module:
    return densenet.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2, num_classes=CLASSES)


def tv_shufflenet() -> nn.Module:
    return shufflenetv2.ShuffleNetV2([1, 1, 1], [8, 16, 32, 64, 128], num_classes=CLASSES)


def tv_vit_model() -> nn.Module:
    return tv_vit.VisionTransformer(
        image_size=IMAGE, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=CLASSES
    )


def timm_resnet_model() -> nn.Module:
    return timm_resnet.ResNet(
        timm_resnet.BasicBlock, (1, 1, 1, 1), channels=(16, 32, 64, 128), stem_width=16, num_classes=CLASSES
    )


def timm_mobilenet_v3() -> nn.Module:
    return timm_mobilenetv3._gen_mobilenet_v3("mobilenetv3_small_100", 0.25, num_classes=CLASSES)


def timm_efficientnet_model() -> nn.Module:
    return timm_efficientnet._gen_efficientnet(
        "efficientnet_b0", channel_multiplier=0.25, depth_multiplier=0.25, num_classes=CLASSES, drop_path_rate=0.0
    )


def timm_convnext_model() -> nn.Module:
    return timm_convnext.ConvNeXt(depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), num_classes=CLASSES)


def timm_vit_model() -> nn.Module:
    return timm_vit.VisionTransformer(
        img_size=IMAGE, patch_size=8, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0, num_classes=CLASSES
    )


def timm_deit() -> nn.Module:
    return timm.create_model(
        "deit_tiny_patch16_224",
        pretrained=False,
        img_size=IMAGE,
        patch_size=8,
        embed_dim=32,
        depth=2,
        num_heads=2,
        num_classes=CLASSES,
    )


def timm_regnet_model() -> nn.Module:
    config = timm_regnet.RegNetCfg(depth=6, w0=8, wa=8.0, wm=1.5, group_size=8)  # four stages
    return timm_regnet.RegNet(config, num_classes=CLASSES)


def tv_swin_model() -> nn.Module:
    return tv_swin.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=[2, 2],
        stochastic_depth_prob=0.0, num_classes=CLASSES,
    )  # fmt: skip


def tv_maxvit_model() -> nn.Module:
    return tv_maxvit.MaxVit(
        input_size=(IMAGE, IMAGE), stem_channels=8, partition_size=2, block_channels=[16, 32], block_layers=[1, 1],
        head_dim=8, stochastic_depth_prob=0.0, num_classes=CLASSES,
    )  # fmt: skip


def timm_mixer() -> nn.Module:
    return timm_mlp_mixer.MlpMixer(num_classes=CLASSES, img_size=IMAGE, patch_size=8, embed_dim=32, num_blocks=2)


def timm_beit_model() -> nn.Module:
    return timm_beit.Beit(
        img_size=IMAGE, patch_size=8, embed_dim=32, depth=2, num_heads=2, use_rel_pos_bias=True, num_classes=CLASSES
    )


def timm_coatnet() -> nn.Module:
    config = timm_maxxvit.MaxxVitCfg(
        embed_dim=(16, 32), depths=(1, 1), block_type=("C", "T"), stem_width=8,
        conv_cfg=timm_maxxvit.MaxxVitConvCfg(expand_ratio=2.0),
        transformer_cfg=timm_maxxvit.MaxxVitTransformerCfg(dim_head=8, window_size=(4, 4), grid_size=(4, 4)),
    )  # fmt: skip
    return timm_maxxvit.MaxxVit(config, img_size=IMAGE, num_classes=CLASSES)


def timm_nfnet_model() -> nn.Module:
    config = timm_nfnet._nfnet_cfg(depths=(1, 1, 1, 1), channels=(16, 32, 48, 64), group_size=8)
    return timm_nfnet.NormFreeNet(config, num_classes=CLASSES)


def timm_pvt_v2_model() -> nn.Module:
    return timm_pvt_v2.PyramidVisionTransformerV2(
        depths=(1, 1, 1, 1), embed_dims=(16, 32, 48, 64), num_heads=(1, 1, 2, 2), num_classes=CLASSES
    )


def timm_poolformer() -> nn.Module:
    return timm_metaformer.MetaFormer(
        depths=(1, 1, 1, 1), dims=(16, 32, 48, 64), token_mixers=timm_metaformer.Pooling,
        norm_layers=timm.layers.GroupNorm1, use_mlp_head=False, num_classes=CLASSES,
    )  # fmt: skip


def _row(name: str, build: object, expect: Expect = ALL, note: str = "") -> ZooModel:
    return ZooModel(name, build, image_batch, classifier_loss, expect, lr=LR, note=note)  # type: ignore[arg-type]


VISION_MODELS: list[ZooModel] = [
    _row("torchvision/resnet", tv_resnet),
    _row("torchvision/mobilenet_v3", tv_mobilenet_v3),
    _row("torchvision/efficientnet", tv_efficientnet),
    _row("torchvision/convnext", tv_convnext),
    _row("torchvision/regnet", tv_regnet),
    _row("torchvision/densenet", tv_densenet),
    _row("torchvision/shufflenet_v2", tv_shufflenet),
    _row("torchvision/vit", tv_vit_model),
    _row("timm/resnet", timm_resnet_model),
    _row("timm/mobilenetv3", timm_mobilenet_v3),
    _row("timm/efficientnet", timm_efficientnet_model),
    _row("timm/convnext", timm_convnext_model),
    _row("timm/vit", timm_vit_model),
    _row("timm/deit", timm_deit),
    _row("timm/regnet", timm_regnet_model),
    _row(
        "torchvision/swin",
        tv_swin_model,
        Expect("all", graph_breaks=True),
        note="window attention: each block runs as one graph (its branch on the window-padded size is a size guard); "
        "above the blocks a branch at swin_transformer.py:160 is still refused, so ORT runs the stages' submodules",
    ),
    _row("torchvision/maxvit", tv_maxvit_model),
    _row("timm/mixer", timm_mixer),
    _row("timm/beit", timm_beit_model),  # relative position bias
    _row("timm/coatnet", timm_coatnet),
    _row("timm/pvt_v2", timm_pvt_v2_model),
    _row("timm/poolformer", timm_poolformer),
    _row(
        "timm/nfnet",
        timm_nfnet_model,
        Expect("all", graph_breaks=True),
        note="weight standardization (F.batch_norm without running statistics): the first stage's three 8-channel "
        "convolutions share one constant bias after ORT merges equal constants, and ORT's BatchNormalization "
        "gradient names a gradient for it in each ('Duplicate definition of name'), so ORT runs that block's "
        "submodules",
    ),
]

"""ResNet-50 v1.5 on ImageNet (and a small 32x32 variant)."""

"""DCA in a Vision Transformer (paper Table 8): a ViT around the LM's residual trunk, image data
(scikit-learn digits, ImageNet-style folders) and a vmapped AdamW training loop. See
:mod:`dca_theory.vit.model`."""

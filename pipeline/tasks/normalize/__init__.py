"""Normalize: rewrite a carved task so it imports torch alone (einops to torch, timm blocks and
helpers as torch definitions); what cannot be rewritten is one `NormalizeError` naming it."""

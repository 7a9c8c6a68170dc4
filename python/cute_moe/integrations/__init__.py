# Seams of the training frameworks through which their models run cute_moe's expert
# kernels. Each lives in its own module and imports its framework; nothing here is
# imported by `import cute_moe`, so the frameworks stay optional:
#   cute_moe.integrations.transformers   experts_implementation="cute_moe" in HF transformers

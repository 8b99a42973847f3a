"""The fuzzer's blocks, one module per family, by kind. A block maps [..., hidden] to [..., hidden] and says what the
passes must do to it (``Block.expect``)."""

from lowering_tests.fuzz.blocks.attention import AttentionBlock
from lowering_tests.fuzz.blocks.base import Block
from lowering_tests.fuzz.blocks.cross_entropy import CrossEntropyBlock
from lowering_tests.fuzz.blocks.embedding import EmbeddingBlock
from lowering_tests.fuzz.blocks.fp8 import LinearsBlock, ScaledMMBlock, TorchaoBlock
from lowering_tests.fuzz.blocks.glu import GLUBlock
from lowering_tests.fuzz.blocks.moe import HFMoEBlock, TitanMoEBlock
from lowering_tests.fuzz.blocks.near_miss import NearMissBlock
from lowering_tests.fuzz.blocks.rmsnorm import NormBlock, NormLinearsBlock, ResidualNormBlock
from lowering_tests.fuzz.blocks.rotary import RotaryBlock
from lowering_tests.fuzz.blocks.tensor_parallel import AllReduceBlock, DgradBlock

KINDS: dict[str, type[Block]] = {
    b.kind: b
    for b in (
        NormBlock,
        ResidualNormBlock,
        NormLinearsBlock,
        GLUBlock,
        LinearsBlock,
        ScaledMMBlock,
        TorchaoBlock,
        AllReduceBlock,
        DgradBlock,
        TitanMoEBlock,
        HFMoEBlock,
        RotaryBlock,
        AttentionBlock,
        EmbeddingBlock,
        CrossEntropyBlock,
        NearMissBlock,
    )
}

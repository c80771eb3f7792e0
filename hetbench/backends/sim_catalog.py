"""The GPUs the sim backend can pretend to be: datasheet figures, each with the public page it comes from.

These figures are printed next to "percent of peak", so each one says where it comes from and which of a
datasheet's several numbers it is. Conventions, for every entry:

- peak_tflops are dense figures (never the 2:4-sparsity ones). fp16/bf16 are the matrix (Tensor Core, MFMA,
  WMMA, XMX) figures where the device has matrix units; fp64 is the matrix figure where the datasheet gives
  one; fp32 is the fastest native fp32 path a GEMM can use (vector FMA, or AMD's fp32 MFMA where it exists),
  never TF32. A dtype the device has no native arithmetic for is left out.
- memory_bytes is the capacity as built (binary GiB, as the memory chips are); the runtime reports a little
  less, which the simulation does not model.
- memory_clock_khz is half the per-pin data rate, the convention of CUDA's memoryClockRate, so that
  2 * memory_clock_khz * memory_bus_width_bits / 8 gives the datasheet bandwidth.
- host_link_gbps is one direction of the PCIe x16 link after 128b/130b encoding: Gen3 15.75, Gen4 31.5,
  Gen5 63.0 GB/s (vendors round these to 16/32/64 and quote the two directions summed).
- launch_latency_us is a modelling assumption, not a datasheet figure: a typical kernel launch (or copy
  start) overhead of about 5 us under CUDA and about 10 us under HIP and OpenCL.
"""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_ORDER = ("fp64", "fp32", "fp16", "bf16")

PCIE_GEN3_X16_GBPS = 15.75
PCIE_GEN4_X16_GBPS = 31.5
PCIE_GEN5_X16_GBPS = 63.0

# modelling assumptions (see the module docstring)
CUDA_LAUNCH_LATENCY_US = 5.0
HIP_LAUNCH_LATENCY_US = 10.0
OPENCL_LAUNCH_LATENCY_US = 10.0

GIB = 2**30

_ARC_A770_XE_CORES = 32
_ARC_A770_CLOCK_HZ = 2.1e9


@dataclass(frozen=True)
class GpuModel:
    """One simulated GPU model. Treat it as read-only data (peak_tflops is a plain dict)."""

    key: str  # what users type after sim:, e.g. sim:h100
    vendor: str  # NVIDIA | AMD | Intel
    name: str  # marketing name
    api: str  # cuda | hip | opencl: the runtime that would drive it (Intel answers no CUDA/HIP)
    peak_tflops: dict[str, float]  # per dtype, dense; see the module docstring for which figure
    memory_bytes: int
    memory_bandwidth_gbps: float  # GB/s, 1e9 bytes
    host_link: str  # the link to the host, e.g. "PCIe 5.0 x16"
    host_link_gbps: float  # one direction, GB/s
    launch_latency_us: float  # modelling assumption
    multiprocessor_count: int  # SMs (NVIDIA), CUs (AMD), or what OpenCL calls compute units (Intel)
    clock_khz: int  # peak (boost) engine clock
    memory_clock_khz: int  # half the per-pin data rate (CUDA's memoryClockRate convention)
    memory_bus_width_bits: int
    compute_capability: tuple[int, int] | None  # NVIDIA only
    gcn_arch_name: str | None  # AMD only: the LLVM target, e.g. gfx942
    source: tuple[str, ...]  # public pages the figures come from, the vendor's first
    notes: str = ""

    def __hash__(self) -> int:  # peak_tflops is a dict; the key identifies a model
        return hash(self.key)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes the model computes in natively, in hetbench's usual order."""
        return tuple(d for d in DTYPE_ORDER if d in self.peak_tflops)


CATALOG: tuple[GpuModel, ...] = (
    GpuModel(
        key="h100",
        vendor="NVIDIA",
        name="NVIDIA H100 SXM5 80GB",
        api="cuda",
        # Hopper whitepaper table (SXM5): FP64 66.9 (Tensor Core; 33.5 without), FP32 66.9, FP16 and BF16
        # Tensor Core 989.4 dense. The datasheet rounds the same figures to 67 / 67 and quotes 1,979 with
        # sparsity for FP16/BF16.
        peak_tflops={"fp64": 66.9, "fp32": 66.9, "fp16": 989.4, "bf16": 989.4},
        memory_bytes=80 * GIB,
        memory_bandwidth_gbps=3350.0,
        host_link="PCIe 5.0 x16",
        host_link_gbps=PCIE_GEN5_X16_GBPS,
        launch_latency_us=CUDA_LAUNCH_LATENCY_US,
        multiprocessor_count=132,
        clock_khz=1_980_000,
        memory_clock_khz=2_619_000,  # HBM3, 5 stacks
        memory_bus_width_bits=5120,
        compute_capability=(9, 0),
        gcn_arch_name=None,
        source=(
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
            "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper",
        ),
    ),
    GpuModel(
        key="a100",
        vendor="NVIDIA",
        name="NVIDIA A100 SXM4 80GB",
        api="cuda",
        # datasheet: FP64 Tensor Core 19.5 (FP64 9.7 without), FP32 19.5, BF16/FP16 Tensor Core 312 dense
        peak_tflops={"fp64": 19.5, "fp32": 19.5, "fp16": 312.0, "bf16": 312.0},
        memory_bytes=80 * GIB,
        memory_bandwidth_gbps=2039.0,
        host_link="PCIe 4.0 x16",
        host_link_gbps=PCIE_GEN4_X16_GBPS,
        launch_latency_us=CUDA_LAUNCH_LATENCY_US,
        multiprocessor_count=108,
        clock_khz=1_410_000,
        memory_clock_khz=1_593_000,  # HBM2e
        memory_bus_width_bits=5120,
        compute_capability=(8, 0),
        gcn_arch_name=None,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
            "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        ),
    ),
    GpuModel(
        key="v100",
        vendor="NVIDIA",
        name="NVIDIA V100 SXM2 16GB",
        api="cuda",
        # datasheet (SXM2): FP64 7.8, FP32 15.7, Tensor Core (FP16 in, FP32 accumulate) 125. Volta has no
        # FP64 Tensor Cores and no bf16.
        peak_tflops={"fp64": 7.8, "fp32": 15.7, "fp16": 125.0},
        memory_bytes=16 * GIB,
        memory_bandwidth_gbps=900.0,
        host_link="PCIe 3.0 x16",  # AWS P3: the GPUs talk NVLink to each other, PCIe Gen3 to the host
        host_link_gbps=PCIE_GEN3_X16_GBPS,
        launch_latency_us=CUDA_LAUNCH_LATENCY_US,
        multiprocessor_count=80,
        clock_khz=1_530_000,
        memory_clock_khz=877_000,  # HBM2
        memory_bus_width_bits=4096,
        compute_capability=(7, 0),
        gcn_arch_name=None,
        source=(
            "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf",
            "https://aws.amazon.com/ec2/instance-types/p3/",
        ),
    ),
    GpuModel(
        key="a10g",
        vendor="NVIDIA",
        name="NVIDIA A10G",
        api="cuda",
        # NVIDIA publishes no A10G datasheet and AWS's G5 page gives no FLOP rates, so these are the NVIDIA A10
        # datasheet's: FP32 31.2, BF16/FP16 Tensor Core 125 dense. The A10 datasheet gives no FP64 figure; the
        # Ampere GA10x whitepaper gives the FP64 rate as 1/64 of FP32, hence 31.2 / 64. (TechPowerUp's database
        # says 1:32 for the A10; NVIDIA's ratio is taken.) Third-party write-ups (e.g. Baseten's A10 vs A10G)
        # describe the A10G as 80 SMs at 1710 MHz, about 35 FP32 and 70 dense FP16 Tensor TFLOPS; NVIDIA and
        # AWS confirm neither, so the A10 datasheet stands.
        peak_tflops={"fp64": 31.2 / 64, "fp32": 31.2, "fp16": 125.0, "bf16": 125.0},
        memory_bytes=24 * GIB,
        memory_bandwidth_gbps=600.0,
        host_link="PCIe 4.0 x16",
        host_link_gbps=PCIE_GEN4_X16_GBPS,
        launch_latency_us=CUDA_LAUNCH_LATENCY_US,
        # what CUDA reports on a G5 instance (the A10 itself has 72 SMs at 1695 MHz)
        multiprocessor_count=80,
        clock_khz=1_710_000,
        memory_clock_khz=6_251_000,  # GDDR6, 12.5 Gbps
        memory_bus_width_bits=384,
        compute_capability=(8, 6),
        gcn_arch_name=None,
        source=(
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/"
            "nvidia-a10-datasheet.pdf",
            "https://aws.amazon.com/ec2/instance-types/g5/",
            "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/",
        ),
        notes="peak figures are the NVIDIA A10 datasheet's; NVIDIA publishes none for the A10G",
    ),
    GpuModel(
        key="mi300x",
        vendor="AMD",
        name="AMD Instinct MI300X",
        api="hip",
        # datasheet: FP64 matrix 163.4 (vector 81.7), FP32 vector and matrix 163.4, FP16/BF16 matrix 1307.4
        # dense (2614.9 with sparsity); 304 CUs at 2100 MHz
        peak_tflops={"fp64": 163.4, "fp32": 163.4, "fp16": 1307.4, "bf16": 1307.4},
        memory_bytes=192 * GIB,
        memory_bandwidth_gbps=5300.0,
        host_link="PCIe 5.0 x16",
        host_link_gbps=PCIE_GEN5_X16_GBPS,
        launch_latency_us=HIP_LAUNCH_LATENCY_US,
        multiprocessor_count=304,
        clock_khz=2_100_000,
        # HBM3 at 5.2 Gbps per pin, 8 stacks; rocm-smi shows the 1300 MHz command clock instead
        memory_clock_khz=2_600_000,
        memory_bus_width_bits=8192,
        compute_capability=None,
        gcn_arch_name="gfx942",
        source=(
            "https://www.amd.com/content/dam/amd/en/documents/instinct-tech-docs/data-sheets/"
            "amd-instinct-mi300x-data-sheet.pdf",
            "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html",
        ),
    ),
    GpuModel(
        key="mi250x",
        vendor="AMD",
        name="AMD Instinct MI250X GCD",
        api="hip",
        # One of the two GCDs (graphics compute dies) of an MI250X: ROCm shows each MI250X as two devices, so
        # that is what a rank gets. Every figure is half the package datasheet's: FP64 matrix 95.7 -> 47.85
        # (vector 47.9 -> 23.95), FP32 matrix (and packed FP32) 95.7 -> 47.85, FP16/BF16 matrix 383 -> 191.5,
        # 128 GB -> 64 GB, 3.2768 TB/s -> 1638.4 GB/s, 220 CUs -> 110; 1700 MHz.
        peak_tflops={"fp64": 95.7 / 2, "fp32": 95.7 / 2, "fp16": 383.0 / 2, "bf16": 383.0 / 2},
        memory_bytes=64 * GIB,
        memory_bandwidth_gbps=3276.8 / 2,
        host_link="PCIe 4.0 x16",  # one link per package, shared by its two GCDs
        host_link_gbps=PCIE_GEN4_X16_GBPS,
        launch_latency_us=HIP_LAUNCH_LATENCY_US,
        multiprocessor_count=110,
        clock_khz=1_700_000,
        memory_clock_khz=1_600_000,  # HBM2e at 3.2 Gbps per pin, 4 stacks per GCD
        memory_bus_width_bits=4096,
        compute_capability=None,
        gcn_arch_name="gfx90a",
        source=(
            "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html",
            "https://rocm.docs.amd.com/en/latest/reference/gpu-specs.html",
        ),
        notes="one GCD of an MI250X (ROCm shows each MI250X as two devices); figures are half the package's",
    ),
    GpuModel(
        key="v520",
        vendor="AMD",
        name="AMD Radeon Pro V520",
        api="hip",
        # AMD publishes no datasheet for this cloud-only part; figures are TechPowerUp's (Navi 12, 36 CUs at
        # 1600 MHz): FP32 7.373, FP16 14.75 (packed FP16: RDNA1 has no matrix units), FP64 0.4608 (1:16).
        # RDNA1 has no bf16 arithmetic.
        peak_tflops={"fp64": 0.4608, "fp32": 7.373, "fp16": 14.75},
        memory_bytes=8 * GIB,
        memory_bandwidth_gbps=512.0,
        host_link="PCIe 4.0 x16",
        host_link_gbps=PCIE_GEN4_X16_GBPS,
        launch_latency_us=HIP_LAUNCH_LATENCY_US,
        multiprocessor_count=36,
        clock_khz=1_600_000,
        memory_clock_khz=1_000_000,  # HBM2 at 2 Gbps per pin, 2 stacks
        memory_bus_width_bits=2048,
        compute_capability=None,
        gcn_arch_name="gfx1011",
        source=(
            "https://www.techpowerup.com/gpu-specs/ (AMD Radeon Pro V520 entry)",
            "https://aws.amazon.com/ec2/instance-types/g4/",
        ),
        notes="AMD publishes no datasheet for the V520; figures are TechPowerUp's",
    ),
    GpuModel(
        key="rx7900xtx",
        vendor="AMD",
        name="AMD Radeon RX 7900 XTX",
        api="hip",
        # AMD's product page: Peak Single Precision 61.4 (counts RDNA3 dual-issue, which GEMMs rarely reach),
        # Peak Half Precision 122.8 (WMMA). WMMA runs bf16 at the fp16 rate (RDNA3 ISA); AMD's page lists
        # only FP16. FP64 1.919 is TechPowerUp's (1:32); AMD lists none.
        peak_tflops={"fp64": 1.919, "fp32": 61.4, "fp16": 122.8, "bf16": 122.8},
        memory_bytes=24 * GIB,
        memory_bandwidth_gbps=960.0,
        host_link="PCIe 4.0 x16",
        host_link_gbps=PCIE_GEN4_X16_GBPS,
        launch_latency_us=HIP_LAUNCH_LATENCY_US,
        multiprocessor_count=96,
        clock_khz=2_500_000,
        memory_clock_khz=10_000_000,  # GDDR6, 20 Gbps
        memory_bus_width_bits=384,
        compute_capability=None,
        gcn_arch_name="gfx1100",
        source=(
            "https://www.amd.com/en/products/graphics/desktops/radeon/7000-series/amd-radeon-rx-7900xtx.html",
            "https://www.techpowerup.com/gpu-specs/ (AMD Radeon RX 7900 XTX entry)",
        ),
    ),
    GpuModel(
        key="arc-a770",
        vendor="Intel",
        name="Intel Arc A770 16GB",
        api="opencl",
        # Intel's specification: 32 Xe-cores, 512 XMX engines, 2100 MHz graphics clock, 560 GB/s. Rates
        # from Intel's Xe-HPG architecture article: per Xe-core and clock 256 FP32 flops (16 vector engines)
        # and 2048 FP16/BF16 flops (16 XMX engines), so FP32 = 32 * 256 * 2.1 GHz = 17.2 and FP16/BF16 =
        # 32 * 2048 * 2.1 GHz = 137.6. No native FP64 (Xe-HPG emulates it). TechPowerUp lists 16 Gbps /
        # 512 GB/s and a 2400 MHz boost for this card; Intel's 17.5 Gbps / 560 GB/s and 2100 MHz are taken.
        peak_tflops={
            "fp32": _ARC_A770_XE_CORES * 256 * _ARC_A770_CLOCK_HZ / 1e12,
            "fp16": _ARC_A770_XE_CORES * 2048 * _ARC_A770_CLOCK_HZ / 1e12,
            "bf16": _ARC_A770_XE_CORES * 2048 * _ARC_A770_CLOCK_HZ / 1e12,
        },
        memory_bytes=16 * GIB,
        memory_bandwidth_gbps=560.0,
        host_link="PCIe 4.0 x16",
        host_link_gbps=PCIE_GEN4_X16_GBPS,
        launch_latency_us=OPENCL_LAUNCH_LATENCY_US,
        multiprocessor_count=512,  # OpenCL compute units: one per vector engine (32 Xe-cores x 16)
        clock_khz=2_100_000,
        memory_clock_khz=8_750_000,  # GDDR6, 17.5 Gbps
        memory_bus_width_bits=256,
        compute_capability=None,
        gcn_arch_name=None,
        source=(
            "https://www.intel.com/content/www/us/en/products/sku/229151/intel-arc-a770-graphics-16gb/"
            "specifications.html",
            "https://www.intel.com/content/www/us/en/developer/articles/technical/"
            "introduction-to-the-xe-hpg-architecture.html",
        ),
    ),
)

MODELS: dict[str, GpuModel] = {m.key: m for m in CATALOG}

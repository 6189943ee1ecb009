"""Official / timm checkpoint layouts -> ours: dispatch and family detection (``detect``), reading and loading
files (``loading``), and the architecture a file holds (``arch``, read through the spec each family declares on
``spec.ArchSpec``)."""
from .arch import (arch_differences, arch_of, arch_report, check_arch, check_model_checkpoint, describe_arch,
                   fitting_args, format_args, structure_differences)
from .detect import (WRAPPER_KEYS, checkpoint_class, convert_whole_model, detect_family, family_match, get_converter,
                     list_converters, unplaced_keys, unwrap_state_dict)
from .loading import (RELEASE_METADATA, ReleaseMetadata, checkpoints_in, fetch_release, load_pretrained,
                      missing_checkpoint_message, placement, read_checkpoint, read_pretrained, release_file_name,
                      resolve_checkpoint)

__all__ = ['WRAPPER_KEYS', 'RELEASE_METADATA', 'ReleaseMetadata', 'arch_differences', 'arch_of', 'arch_report',
           'structure_differences', 'check_arch', 'check_model_checkpoint', 'checkpoint_class', 'convert_whole_model',
           'describe_arch',
           'detect_family', 'family_match', 'fetch_release', 'fitting_args', 'format_args', 'get_converter',
           'list_converters', 'load_pretrained', 'missing_checkpoint_message', 'placement', 'read_checkpoint',
           'read_pretrained', 'release_file_name', 'unplaced_keys', 'unwrap_state_dict', 'checkpoints_in',
           'resolve_checkpoint']

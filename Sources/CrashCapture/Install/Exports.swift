// The error every CrashCapture call throws is defined once, in CrashFileFormat (the module
// the others build on); apps name it after `import CrashCapture` alone.
@_exported public import struct CrashFileFormat.CrashCaptureError

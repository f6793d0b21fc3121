// The Swift form of inline.c: a method inlined into its caller, built with -O.
struct Parser {
    let base: UnsafePointer<Int>

    @inline(__always) func field(_ index: Int) -> Int { base[index] &* 3 }

    @inline(__always) func read(_ count: Int) -> Int {
        var sum = 0
        for index in 0..<count { sum &+= field(index) }
        return sum
    }
}

@inline(never) func process(_ parser: Parser, _ count: Int) -> Int { parser.read(count) &+ 1 }

let count = CommandLine.arguments.count
// A non-null address no one maps: the read faults (SIGSEGV), it does not trap.
let parser = Parser(base: UnsafePointer<Int>(bitPattern: 16 &* (count > 8 ? 0x1000 : 1))!)
#if SECOND
    print("second build:", process(parser, count))
#else
    print(process(parser, count))
#endif

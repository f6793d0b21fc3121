// The C++ form of inline.c: methods of a class in a namespace, inlined into a caller.
#include <cstdio>
#include <cstdlib>

namespace ledger {
struct Entry {
    int amount;
};

class Book {
  public:
    explicit Book(Entry *entries) : entries_(entries) {}
    inline __attribute__((always_inline)) int amount(int index) const { return entries_[index].amount * 2; }
    inline __attribute__((always_inline)) int total(int count) const {
        int sum = 0;
        for (int index = 0; index < count; index++) sum += amount(index);
        return sum;
    }

  private:
    Entry *entries_;
};

__attribute__((noinline)) int balance(const Book &book, int count) { return book.total(count) + 1; }
}  // namespace ledger

int main(int argc, char **) {
    static ledger::Entry *volatile entries;
    entries = argc > 8 ? static_cast<ledger::Entry *>(calloc(16, sizeof(ledger::Entry))) : nullptr;
    ledger::Book book(entries);
#ifdef SECOND
    std::printf("second build: %d\n", ledger::balance(book, argc));
#else
    std::printf("%d\n", ledger::balance(book, argc));
#endif
    return 0;
}
